"""One training run: check the config and the data (before any model loads), train with TRL's GRPOTrainer, save the
model folder (`model:PATH`), evaluate it beside `rules`, and register it in `models`.

    OUTPUT/warmup/        the supervised warm-up's model, when [warmup] steps > 0: GRPO starts from it
    OUTPUT/checkpoints/   TRL checkpoints (resume with --resume)
    OUTPUT/metrics.jsonl  every logged figure, one line per logging step
    OUTPUT/tensorboard/   the same for TensorBoard
    OUTPUT/model/         the weights or LoRA adapter, tokenizer and reviser.json: what `model:PATH` loads
    OUTPUT/eval/SUITE/    `tracemill eval` reports: the dataset's eval split and the built-in suites
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tracemill.trainer.config import TrainConfig
from tracemill.trainer.dataset import PromptRows, load_rows
from tracemill.trainer.launch import launch_command, shell, vllm_server_command
from tracemill.trainer.rewards import REWARD_FUNCTIONS, TERMS

CHECKPOINTS, METRICS, TENSORBOARD, MODEL, EVAL = "checkpoints", "metrics.jsonl", "tensorboard", "model", "eval"
WARMUP, WARMED = "warmup", "warmed-up"  # the warm-up's model folder, and the file that says it is whole


@dataclass(slots=True)
class Plan:
    """A run as it will go, resolved: what `--dry-run` prints."""

    config: TrainConfig
    config_path: Path | None  # None: a config made in code
    rows: PromptRows
    device: str

    @property
    def out(self) -> Path:
        return self.config.output.dir

    @property
    def start_model(self) -> str:
        """The model GRPO starts from: the warm-up's when there is one, else the base."""
        return str(self.out / WARMUP) if self.config.warmup.steps else self.config.model.base

    def reward_names(self) -> list[str]:
        return [*TERMS, *(["judge"] if self.config.rewards.judge.enabled else [])]

    def reward_weights(self) -> list[float]:
        weights = [self.config.rewards.weights[t] for t in TERMS]
        return weights + ([self.config.rewards.judge.weight] if self.config.rewards.judge.enabled else [])

    def grpo_arguments(self) -> dict[str, Any]:
        c, g, gen = self.config, self.config.grpo, self.config.generation
        precision = c.launch.mixed_precision if self.device == "cuda" else "no"
        return {
            "output_dir": str(self.out / CHECKPOINTS), "use_cpu": self.device == "cpu",
            "bf16": precision == "bf16", "fp16": precision == "fp16",
            "per_device_train_batch_size": g.per_device_batch_size,
            "gradient_accumulation_steps": g.gradient_accumulation_steps, "num_generations": g.num_generations,
            "max_completion_length": g.max_completion_length, "learning_rate": g.learning_rate,
            "loss_type": g.loss_type, "beta": g.beta, "temperature": g.temperature, "max_steps": g.max_steps,
            "num_train_epochs": g.epochs, "seed": g.seed, "scale_rewards": g.scale_rewards,
            "gradient_checkpointing": g.gradient_checkpointing, "reward_weights": self.reward_weights(),
            "logging_steps": c.output.logging_steps, "save_strategy": "steps", "save_steps": c.output.save_steps,
            "save_total_limit": c.output.save_total_limit, "report_to": "none", "remove_unused_columns": False,
            "use_vllm": gen.use_vllm, "vllm_mode": gen.vllm_mode, "vllm_server_base_url": gen.vllm_server_base_url,
            "vllm_gpu_memory_utilization": gen.vllm_gpu_memory_utilization,
            "vllm_tensor_parallel_size": gen.vllm_tensor_parallel_size,
        }

    def describe(self) -> dict[str, Any]:
        server = vllm_server_command(self.config)
        return {
            "command": shell(launch_command(self.config, self.config_path)) if self.config_path else None,
            "vllm_server_command": shell(server) if server else None,
            "device": self.device,
            "start_model": self.start_model,
            "dataset": {"folder": str(self.rows.folder), "train_rows": self.rows.train_rows,
                        "eval_rows": self.rows.eval_rows, "content_hash": self.rows.content_hash,
                        "failure_classes": self.rows.failure_classes,
                        "prompt_settings": self.rows.prompt_settings.to_dict()},
            "rewards": dict(zip(self.reward_names(), self.reward_weights(), strict=True)),
            "grpo": self.grpo_arguments(),
            "config": self.config.model_dump(mode="json"),
        }


def resolve_device(wanted: str) -> str:
    if wanted != "auto":
        return wanted
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def make_plan(config: TrainConfig, config_path: Path | None = None) -> Plan:
    """Raises DatasetError for data that cannot be trained on; loads no model."""
    return Plan(config, config_path, load_rows(config.data.dataset), resolve_device(config.device))


@dataclass(slots=True)
class Outcome:
    model_dir: Path | None
    interrupted: bool = False
    main_process: bool = True
    metrics: dict[str, Any] = field(default_factory=dict)


def _dtype(plan: Plan) -> str:
    wanted = plan.config.model.dtype
    if wanted != "auto":
        return wanted
    return "bfloat16" if plan.device == "cuda" else "float32"


CURVES = ("reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "completions/mean_length",
          "copied_invalid", "valid_changed", "judge_failed")


def summarize(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Training figures for the registry: the run's length; a curve (one value per logged step, None where a step
    had none) of the reward, each term and the other figures worth plotting; and each figure's mean over the last
    quarter of the steps."""
    steps = [h for h in history if "reward" in h]
    end = next((h for h in reversed(history) if "train_runtime" in h), {})
    summary: dict[str, Any] = {"steps": history[-1].get("step", 0) if history else 0,
                               "train_runtime_s": end.get("train_runtime"), "step": [h.get("step") for h in steps]}
    keys = [k for k in dict.fromkeys(k for h in steps for k in h) if k in CURVES or k.startswith("rewards/")]
    tail = steps[-max(1, len(steps) // 4):]
    summary["final"] = {}
    for key in keys:
        summary[key] = [h.get(key) if isinstance(h.get(key), (int, float)) else None for h in steps]
        last = [h[key] for h in tail if isinstance(h.get(key), (int, float))]
        if last:
            summary["final"][key] = statistics.fmean(last)
    return summary


def train(plan: Plan, resume: bool = False, echo: Callable[[str], None] = print) -> Outcome:
    """Train and save the model folder. Checkpoints of another run in the output folder are never overwritten."""
    from transformers.trainer_callback import ProgressCallback
    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOConfig, GRPOTrainer

    from tracemill.trainer.callbacks import CompactProgress, MetricsLog, StopOnInterrupt, TensorBoard
    from tracemill.trainer.model_reviser import ReviserCard

    c = plan.config
    checkpoints = plan.out / CHECKPOINTS
    last = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    if resume and last is None:
        raise RuntimeError(f"{checkpoints}: no checkpoint to resume from")
    if not resume and last is not None:
        raise RuntimeError(f"{plan.out} holds checkpoints of an earlier run ({Path(last).name}): use --resume to go "
                           "on from it, or set another output.dir")
    plan.out.mkdir(parents=True, exist_ok=True)
    if c.warmup.steps and not (plan.out / WARMUP / WARMED).is_file():
        from tracemill.trainer.warmup import warm_up

        echo(f"warm-up: {c.warmup.steps} supervised steps on the train split's (prompt, answer) pairs")
        warm_up(c.model.base, plan.rows.read(limit=c.data.max_train_rows), plan.out / WARMUP, c.warmup.steps,
                c.warmup.learning_rate, c.warmup.batch_size, c.grpo.seed, plan.device, plan.rows.prompt_settings,
                c.eval.max_new_tokens or c.grpo.max_completion_length)
        (plan.out / WARMUP / WARMED).write_text(f"{c.warmup.steps} steps from {c.model.base}\n")
    rewards: list[Any] = [REWARD_FUNCTIONS[t] for t in TERMS]
    if c.rewards.judge.enabled:
        from tracemill.trainer.judge import LLMJudge

        rewards.append(LLMJudge(str(c.rewards.judge.url), c.rewards.judge.model, c.grpo.num_generations,
                               c.rewards.judge.timeout))
    peft_config = None
    if c.model.kind == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=c.model.lora_r, lora_alpha=c.model.lora_alpha, lora_dropout=c.model.lora_dropout,
                                 target_modules=c.model.target_modules, task_type="CAUSAL_LM")
    args = GRPOConfig(**plan.grpo_arguments(), model_init_kwargs={"dtype": _dtype(plan)}, disable_tqdm=False)
    stop = StopOnInterrupt()
    callbacks: list[Any] = [MetricsLog(plan.out / METRICS), stop]
    if c.output.tensorboard:
        callbacks.append(TensorBoard(plan.out / TENSORBOARD))
    rows = plan.rows.training_dataset(plan.out, c.data.max_train_rows)
    trainer = GRPOTrainer(model=plan.start_model, reward_funcs=rewards, args=args, peft_config=peft_config,
                          train_dataset=rows, callbacks=callbacks)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(CompactProgress())
    trainer.train(resume_from_checkpoint=last if resume else None)
    main = trainer.accelerator.is_main_process
    metrics = summarize(trainer.state.log_history)
    if stop.interrupted:
        return Outcome(None, interrupted=True, main_process=main, metrics=metrics)
    for cached in rows.cache_files:  # kept for --resume until the run is done; each process maps its own
        Path(cached["filename"]).unlink(missing_ok=True)
    model_dir = plan.out / MODEL
    trainer.save_model(str(model_dir))
    if main:
        trainer.processing_class.save_pretrained(str(model_dir))
        ReviserCard(plan.start_model, c.model.kind, plan.rows.prompt_settings,
                    c.eval.max_new_tokens or c.grpo.max_completion_length,
                    {"dataset": str(plan.rows.folder), "dataset_hash": plan.rows.content_hash}).save(model_dir)
        (plan.out / "run.json").write_bytes(orjson.dumps(plan.describe(), option=orjson.OPT_INDENT_2))
    del trainer
    gc.collect()
    return Outcome(model_dir, main_process=main, metrics=metrics)

