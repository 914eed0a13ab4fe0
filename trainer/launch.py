"""How a training run is launched: one process (`tracemill train`), or `accelerate launch` over several GPUs with the
accelerate configs shipped here (DDP, DeepSpeed ZeRO-2, ZeRO-3), and, for vLLM in server mode, the server to start."""

from __future__ import annotations

import shlex
import sys
from importlib import resources
from pathlib import Path

from tracemill.trainer.config import TrainConfig

LAUNCHED_FLAG = "--launched"  # marks a worker process started by `accelerate launch`


def accelerate_config(config: TrainConfig) -> Path:
    """The accelerate config file for a run's [launch] section."""
    name = {"zero2": "zero2.yaml", "zero3": "zero3.yaml", None: "multi_gpu.yaml"}[config.launch.deepspeed]
    return Path(str(resources.files("tracemill.trainer").joinpath("accelerate", name)))


def needs_accelerate(config: TrainConfig) -> bool:
    return config.launch.num_processes > 1 or config.launch.deepspeed is not None


def launch_command(config: TrainConfig, config_path: Path, db_url: str | None = None) -> list[str]:
    """The command that runs this config (registering in `db_url`, when given, as `train --db` does): `tracemill
    train` itself, or `accelerate launch` of it."""
    train = ["-m", "tracemill.cli", "train", "--config", str(config_path.resolve())]
    if db_url:
        train += ["--db", db_url]
    if not needs_accelerate(config):
        return [sys.executable, *train]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accelerate_config(config)),
            "--num_processes", str(config.launch.num_processes), "--mixed_precision",
            config.launch.mixed_precision, *train, LAUNCHED_FLAG]


def vllm_server_command(config: TrainConfig) -> list[str] | None:
    """For `vllm_mode = "server"`: the generation server to start first, on GPUs the trainer does not use."""
    if not (config.generation.use_vllm and config.generation.vllm_mode == "server"):
        return None
    return ["trl", "vllm-serve", "--model", config.model.base,
            "--tensor_parallel_size", str(config.generation.vllm_tensor_parallel_size)]


def shell(command: list[str]) -> str:
    return shlex.join(command)
