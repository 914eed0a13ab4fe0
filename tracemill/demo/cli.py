"""`tracemill demo`: the whole loop on one machine, SQLite and the CPU only.

A collector, a weak model server and the reviser sidecar (`tracemill serve`) in front of it; an agent instrumented
with the SDK runs MCP-Bench tasks with no sidecar, then through the sidecar (the rules revise); `tracemill cycle
--force` mines the store, trains a tiny reviser model with GRPO for a few steps, evaluates it against the active
reviser and deploys it if its gate passes; the agent runs again through the sidecar, and the figures of the three
phases are printed side by side."""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from tracemill.demo.agent import STOP

CYCLE_CONFIG = """\
device = "cpu"

[cycle]
base = "{base}"
work = "{work}"
force = true
reference_margin = {margin}
schema_margin = {margin}

[mine]
# phase 1 runs each episode twice (without and with the sidecar): most prompts come twice, and eval keeps only those
# train does not have. Half the traces in eval leaves the gate its 30 held-out cases (min_held_out_cases)
eval_share = 0.5
max_tools = 1
budget_tokens = 48

[model]
kind = "full"

[warmup]
steps = {warmup}
learning_rate = 3e-3

[grpo]
num_generations = 4
per_device_batch_size = 8
max_completion_length = 48
max_steps = {steps}
learning_rate = 1e-3
seed = {seed}

[output]
save_steps = {steps}
tensorboard = false

[eval]
suites = []
"""

ON_A_GPU = """\
[bold]Which figures come from a tiny CPU model.[/] The model that writes the agent's calls is simulated (MCP-Bench's
real tool schemas, a weak open model's fault rates); the no-sidecar and rules rows measure the rules reviser on it
and need no model. The reviser model is {params} built here (`tracemill tiny-model`), warmed up for {warmup} supervised
steps and trained for {steps} GRPO steps on the CPU by `tracemill cycle`: it only shows the loop running end to end and
the gate deciding on measured figures. It is not expected to beat the rules, which it stands behind (it is asked only
where they fail, and its answer is kept only when valid).
[bold]With a real model on a GPU[/], the same commands: `tracemill cycle --config FILE` with `\\[cycle] base =
"Qwen/Qwen3-4B-Instruct-2507"`, `\\[model] kind = "lora"`, `\\[generation] use_vllm = true` and a few hundred steps
(README, "Train a reviser model"), from cron or `--every 24h`; `tracemill serve --upstream http://HOST:8001/v1 --vllm
http://HOST:8001/v1` in front of the agent's vLLM server loads each deployed version into it as a LoRA adapter."""


@dataclass(frozen=True, slots=True)
class Sizes:
    episodes: int
    warmup_steps: int
    steps: int
    margin: float
    profile: str
    harness_version: str
    seed: int


MARKER = ".tracemill-demo"  # in each folder the demo made: only such a folder is replaced


def _fresh(folder: Path) -> None:
    """An empty folder for the demo; an earlier demo's is replaced, anything else is refused."""
    if folder.exists() and any(folder.iterdir()):
        if not (folder / MARKER).exists():
            raise click.UsageError(f"{folder} holds something other than an earlier demo; give another --dir")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).touch()


def _now() -> datetime:
    return datetime.now(UTC)


@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM stops the demo as Ctrl-C does. Either is also kept in `STOP`: a KeyboardInterrupt raised while the
    garbage collector runs a `__del__` is printed and lost, so the agent's loop checks `STOP` between episodes."""
    def interrupt(signum: int, frame: Any) -> None:
        STOP.set()
        raise KeyboardInterrupt

    before = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@click.command()
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path), default=Path("tracemill-demo"),
              show_default=True, help="Folder for the demo's store, data, model and logs (replaced on each run).")
@click.option("--episodes", type=click.IntRange(4), default=120, show_default=True,
              help="Agent episodes (MCP-Bench tasks) in each of the three phases.")
@click.option("--warmup-steps", type=click.IntRange(0), default=20, show_default=True,
              help="Supervised warm-up steps of the tiny reviser before GRPO.")
@click.option("--steps", type=click.IntRange(1), default=6, show_default=True, help="GRPO steps.")
@click.option("--margin", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="How much better than the rules the candidate must be to be deployed (reference match and schema "
                   "compliance on the held-out split; 0: not worse).")
@click.option("--profile", default="llama3.1-8b", show_default=True, help="The weak model's fault profile.")
@click.option("--harness-version", default="prompt-v5", show_default=True,
              help="The agent's harness version (tracemill.simulate.harness; prompt-v5: where tuning has plateaued).")
@click.option("--seed", type=int, default=0, show_default=True)
def demo(folder: Path, episodes: int, warmup_steps: int, steps: int, margin: float, profile: str,
         harness_version: str, seed: int) -> None:
    """The whole loop on SQLite and the CPU: traffic without and with the reviser sidecar, mine, train a tiny
    reviser, evaluate, deploy if the gate passes, more traffic, and the figures before and after."""
    from tracemill.console import text_console
    from tracemill.demo.processes import DemoError, Processes
    from tracemill.demo.run import Demo

    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # each line as it comes, through a pipe too (make demo | tee)
    console = text_console()
    folder = folder.resolve()
    _fresh(folder)
    sizes = Sizes(episodes, warmup_steps, steps, margin, profile, harness_version, seed)
    processes = Processes(folder / "logs", env={"TRACEMILL_SERVE_POLL_SECONDS": "0.5"})
    run = Demo(folder, sizes, processes, console)
    started = time.monotonic()
    try:
        with _stop_on_sigterm():
            run.run()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave a process running
        run.close()
        console.print(f"\n[bold]stopped[/] after {time.monotonic() - started:.0f} s: every process the demo started "
                      f"is stopped; the store {folder / 'store.db'} holds what was collected so far.")
        raise SystemExit(130) from None
    except DemoError as exc:
        run.close()
        raise click.ClickException(str(exc)) from None
    finally:
        run.close()
    console.print(f"\ndone in {time.monotonic() - started:.0f} s. Open the UI on the demo's store:\n"
                  f"  tracemill users add admin --role admin --db sqlite:///{folder / 'store.db'}\n"
                  f"  tracemill ui --db sqlite:///{folder / 'store.db'}")
    console.print(ON_A_GPU.format(params=run.tiny_size or "a tiny model", warmup=warmup_steps, steps=steps))
    (folder / "demo.json").write_text(json.dumps(run.summary(), indent=2))
