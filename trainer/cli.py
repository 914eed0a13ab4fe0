"""`tracemill train`: GRPO on a `tracemill mine` export, then eval and registration of the new reviser version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

from tracemill.store.cli import database_option


@click.command("train")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The training config (TOML; see tracemill/trainer/config.py and the README).")
@click.option("--dry-run", is_flag=True, help="Check the config and the dataset, print the launch command and the "
              "resolved settings as JSON, and stop before any model loads.")
@click.option("--resume", is_flag=True, help="Go on from the newest checkpoint in the output folder.")
@database_option
@click.option("--launched", is_flag=True, hidden=True)
def train_command(config_path: Path, dry_run: bool, resume: bool, db_url: str | None, launched: bool) -> None:
    """Train a reviser with GRPO (reward: the verifier), evaluate it beside `rules`, register it in `models`."""
    from tracemill.trainer.config import ConfigError, load_config
    from tracemill.trainer.dataset import DatasetError
    from tracemill.trainer.launch import launch_command, needs_accelerate, shell
    from tracemill.trainer.run import make_plan

    try:
        config = load_config(config_path)
        plan = make_plan(config, config_path)
    except (ConfigError, DatasetError) as exc:
        raise click.ClickException(str(exc)) from None
    command = launch_command(config, config_path, db_url) + (["--resume"] if resume else [])
    if dry_run:
        described = plan.describe()
        click.echo(f"command: {shell(command)}")
        if described["vllm_server_command"]:
            click.echo(f"vllm server (start first, on other GPUs): {described['vllm_server_command']}")
        click.echo(json.dumps(described, indent=2))
        return
    if needs_accelerate(config) and not launched:
        click.echo(f"launching: {shell(command)}", err=True)
        sys.exit(subprocess.call(command))
    _run(plan, resume, db_url)


def _run(plan, resume: bool, db_url: str | None) -> None:  # type: ignore[no-untyped-def]
    from tracemill.revisers import ReviserSpecError
    from tracemill.trainer.finish import evaluate_model, register
    from tracemill.trainer.model_reviser import ModelReviser
    from tracemill.trainer.run import train

    try:
        outcome = train(plan, resume, echo=click.echo)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    if outcome.interrupted:
        click.echo(f"stopped; checkpoints are in {plan.out / 'checkpoints'}: run again with --resume to go on",
                   err=True)
        sys.exit(130)
    if not outcome.main_process or outcome.model_dir is None:
        return
    click.echo(f"model saved to {outcome.model_dir}")
    evaluation = {}
    if plan.config.eval.enabled:
        try:
            model = ModelReviser(str(outcome.model_dir))
        except ReviserSpecError as exc:
            raise click.ClickException(str(exc)) from None
        evaluation = evaluate_model(plan, model, echo=click.echo)
    if plan.config.output.register_model:
        row = register(plan, outcome.model_dir, outcome.metrics, evaluation, db_url)
        click.echo(f"registered {row.name} (models.id {row.id}): tracemill models list")
