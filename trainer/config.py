"""The training config: one TOML file, validated before anything heavy loads. Every section and field has a default
that works except `model.base` and `data.dataset`; unknown keys are errors, so a typo is never silently ignored.

    [model]       base = "Qwen/Qwen3-4B-Instruct-2507" or a local folder; kind = "lora" | "full"; LoRA settings
    [data]        dataset = the folder `tracemill mine --out` wrote (train.jsonl, eval.jsonl, dataset.json)
    [warmup]      optional supervised steps on (prompt, answer) pairs first (`tracemill.trainer.warmup`)
    [grpo]        generations per prompt, completion length, learning rate, loss type, KL beta, steps, batch sizes
    [generation]  use_vllm, vllm_mode = "colocate" (one GPU) | "server" (`trl vllm-serve` on other GPUs)
    [rewards]     a weight per term (`tracemill.trainer.rewards`); [rewards.judge] the optional LLM judge
    [output]      dir (checkpoints, metrics.jsonl, tensorboard/, model/), checkpoint interval, model name
    [eval]        after training: `tracemill eval` on the eval split and built-in suites, beside `rules`
    [launch]      processes (GPUs) and DeepSpeed ZeRO stage for `accelerate launch`

Relative paths are read from the config file's folder.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tracemill.trainer.rewards import DEFAULT_WEIGHTS, TERMS


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file, the field and why."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(_Section):
    base: str = Field(description="a local Hugging Face causal LM folder or a hub id")
    kind: Literal["lora", "full"] = "lora"
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


class DataSection(_Section):
    dataset: Path
    max_train_rows: int | None = Field(None, ge=1)


class WarmupSection(_Section):
    steps: int = Field(0, ge=0)  # supervised steps on (prompt, answer) pairs before GRPO; 0: none
    learning_rate: float = Field(2e-5, gt=0)
    batch_size: int = Field(8, ge=1)


class GRPOSection(_Section):
    num_generations: int = Field(8, ge=2)
    max_completion_length: int = Field(256, ge=1)
    learning_rate: float = Field(1e-5, gt=0)
    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo"] = "dapo"
    beta: float = Field(0.0, ge=0)
    temperature: float = Field(1.0, gt=0)
    per_device_batch_size: int = Field(8, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    max_steps: int = Field(-1, ge=-1)
    epochs: float = Field(1.0, gt=0)
    seed: int = 0
    gradient_checkpointing: bool = False
    scale_rewards: Literal["group", "batch", "none"] = "group"


class GenerationSection(_Section):
    use_vllm: bool = False
    vllm_mode: Literal["colocate", "server"] = "colocate"
    vllm_server_base_url: str | None = None
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    vllm_tensor_parallel_size: int = Field(1, ge=1)


class JudgeSection(_Section):
    enabled: bool = False
    url: str | None = None
    model: str = "judge"
    weight: float = 1.0
    timeout: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _url_when_enabled(self) -> JudgeSection:
        if self.enabled and not self.url:
            raise ValueError("an enabled judge needs `url` (an OpenAI-compatible /v1 base URL)")
        return self


class RewardsSection(_Section):
    weights: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    judge: JudgeSection = Field(default_factory=JudgeSection)

    @model_validator(mode="after")
    def _known_terms(self) -> RewardsSection:
        unknown = sorted(set(self.weights) - set(TERMS))
        if unknown:
            raise ValueError(f"unknown reward term(s) {', '.join(unknown)}; terms: {', '.join(TERMS)}")
        self.weights = {**DEFAULT_WEIGHTS, **self.weights}
        return self


class OutputSection(_Section):
    dir: Path = Path("runs/reviser")
    name: str | None = None  # the model version's name; default reviser-NNNN
    save_steps: int = Field(50, ge=1)
    save_total_limit: int = Field(2, ge=1)
    logging_steps: int = Field(1, ge=1)
    tensorboard: bool = True
    register_model: bool = True
    database_url: str | None = None  # default: TRACEMILL_DATABASE_URL


class EvalSection(_Section):
    enabled: bool = True
    suites: list[Literal["bfcl", "mcp-bench", "do-no-harm"]] = Field(default_factory=lambda: ["do-no-harm", "bfcl"])
    limit: int | None = Field(300, ge=1)  # cases per suite (the eval split is always whole)
    max_new_tokens: int | None = Field(None, ge=1)  # default: grpo.max_completion_length


class LaunchSection(_Section):
    num_processes: int = Field(1, ge=1)
    deepspeed: Literal["zero2", "zero3"] | None = None
    mixed_precision: Literal["no", "bf16", "fp16"] = "bf16"


class TrainConfig(_Section):
    model: ModelSection
    data: DataSection
    warmup: WarmupSection = Field(default_factory=WarmupSection)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    generation: GenerationSection = Field(default_factory=GenerationSection)
    rewards: RewardsSection = Field(default_factory=RewardsSection)
    output: OutputSection = Field(default_factory=OutputSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    launch: LaunchSection = Field(default_factory=LaunchSection)
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        batch = self.grpo.per_device_batch_size * self.grpo.gradient_accumulation_steps * self.launch.num_processes
        if batch % self.grpo.num_generations:
            raise ValueError(f"grpo: per_device_batch_size x gradient_accumulation_steps x launch.num_processes "
                             f"({batch}) must be a multiple of num_generations ({self.grpo.num_generations})")
        if self.device == "cpu" and (self.generation.use_vllm or self.launch.deepspeed):
            raise ValueError("device = \"cpu\" cannot use vLLM or DeepSpeed")
        if self.launch.deepspeed == "zero3" and self.model.kind == "lora" and self.generation.use_vllm:
            raise ValueError("launch.deepspeed = \"zero3\" with LoRA and vLLM: use zero2 for LoRA, zero3 for full")
        return self

    def resolve(self, folder: Path) -> TrainConfig:
        """Paths read from `folder` (the config file's)."""
        data = self.data.model_copy(update={"dataset": (folder / self.data.dataset).resolve()})
        output = self.output.model_copy(update={"dir": (folder / self.output.dir).resolve()})
        base = folder / self.model.base
        model = self.model.model_copy(update={"base": str(base.resolve())}) if base.exists() else self.model
        return self.model_copy(update={"data": data, "output": output, "model": model})


def _where(error: dict[str, Any]) -> str:
    return ".".join(str(p) for p in error["loc"]) or "(top level)"


def parse_config(data: dict[str, Any], folder: Path, source: str) -> TrainConfig:
    try:
        config = TrainConfig.model_validate(data)
    except ValidationError as exc:  # every mistake named at once: a config is fixed in one go, not one per run
        said = "; ".join(f"{_where(e)}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{source}: {said}") from None
    return config.resolve(folder)


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's tables. Raises ConfigError naming the file when it cannot be read or is not TOML."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def load_config(path: Path) -> TrainConfig:
    """The config in a TOML file. Raises ConfigError."""
    return parse_config(read_toml(path), path.parent.resolve(), str(path))
