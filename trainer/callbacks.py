"""What a training run shows and keeps while it runs: every logged figure as a line of `metrics.jsonl` and in
TensorBoard, a progress bar with the reward, and a clean stop on Ctrl-C (a checkpoint after the current step, then
out)."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.integrations import TensorBoardCallback
from transformers.trainer_callback import ProgressCallback


def _known(logs: dict[str, Any] | None) -> dict[str, Any]:
    """The figures a step had: a term that applied to no row of its batch is NaN (or None), not 0."""
    return {k: v for k, v in (logs or {}).items() if v is not None and not (isinstance(v, float) and math.isnan(v))}


class MetricsLog(TrainerCallback):
    """Appends each log of the trainer (reward per term, KL, completion length, share of all-tied groups, ...) to a
    JSON Lines file, one object per logging step."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in logs.items()}
        with open(self.path, "a") as fh:  # null: the figure had no value at this step
            fh.write(json.dumps({"step": state.global_step, **clean}) + "\n")


class TensorBoard(TensorBoardCallback):
    """TensorBoard scalars in `log_dir`, each step's known figures only."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        super().__init__(tb_writer=SummaryWriter(str(log_dir)))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().on_log(args, state, control, logs=_known(logs), **kwargs)


class CompactProgress(ProgressCallback):
    """The trainer's progress bar, with the reward and loss beside it instead of a printed dict per step."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if state.is_world_process_zero and self.training_bar is not None and logs:
            shown = {k: f"{logs[k]:.3g}" for k in ("reward", "loss", "frac_reward_zero_std")
                     if isinstance(logs.get(k), (int, float))}
            self.training_bar.set_postfix(shown, refresh=False)


class StopOnInterrupt(TrainerCallback):
    """Ctrl-C saves a checkpoint after the step in progress and ends training; a second Ctrl-C stops at once."""

    def __init__(self) -> None:
        self.interrupted = False
        self._previous: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.interrupted = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\ninterrupted: saving a checkpoint after this step (Ctrl-C again to stop now)", flush=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if self.interrupted:
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
