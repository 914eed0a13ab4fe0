"""The model registry: each training run's reviser version is a row in `models` (base, weights or adapter, the data
and config it was trained with, its training and eval figures). `tracemill models list` shows them.

`metrics`: `steps`, `train_runtime_s`, `step` and a curve per figure (a list, one value per logged step: `reward`,
`rewards/TERM/mean`, `frac_reward_zero_std`, `kl`, ...), and `final` (each figure's mean over the last quarter).
`evaluation`: per suite (`eval` is the dataset's eval split), `{"cases", "broken_cases", "rules": {...}, "model":
{...}}` with `tracemill eval`'s metrics."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import click
from sqlalchemy import Engine, func, select

from tracemill.rates import percent
from tracemill.store.cli import database_option, read_store
from tracemill.store.tables import DatasetRow, ModelRow


@dataclass(frozen=True, slots=True)
class NewModel:
    base_model: str
    kind: str
    path: str
    dataset_hash: str | None
    config: dict[str, Any]
    metrics: dict[str, Any]
    evaluation: dict[str, Any]
    name: str | None = None


def register_model(engine: Engine, model: NewModel) -> ModelRow:
    """Insert the version (named `reviser-NNNN` after the newest when it has no name), linked to the `datasets` row
    of the same content hash when the export was registered. One transaction: a version is stored whole or not."""
    from sqlalchemy.orm import Session

    with Session(engine, expire_on_commit=False) as session, session.begin():
        dataset_id = None
        if model.dataset_hash:
            dataset_id = session.scalar(select(DatasetRow.id).where(DatasetRow.content_hash == model.dataset_hash)
                                        .order_by(DatasetRow.id.desc()).limit(1))
        name = model.name or f"reviser-{(session.scalar(select(func.max(ModelRow.id))) or 0) + 1:04d}"
        row = ModelRow(name=name, base_model=model.base_model, kind=model.kind, path=model.path,
                       dataset_id=dataset_id, dataset_hash=model.dataset_hash, config=model.config,
                       metrics=model.metrics, evaluation=model.evaluation)
        session.add(row)
    return row


def list_models(engine: Engine) -> list[ModelRow]:
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        return list(session.scalars(select(ModelRow).order_by(ModelRow.id)))


def _figure(evaluation: dict[str, Any], suite: str, reviser: str, key: str) -> str:
    metrics = (evaluation.get(suite) or {}).get(reviser)
    return percent(metrics.get(key)) if isinstance(metrics, dict) else "-"


@click.group()
def models() -> None:
    """The trained reviser versions."""


@models.command("list")
@database_option
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON.")
def list_command(db_url: str | None, as_json: bool) -> None:
    """Every trained version: base, kind, data, and its eval figures beside `rules`."""
    from rich.table import Table

    from tracemill.console import print_table

    rows = list_models(read_store(db_url))
    if as_json:
        click.echo(json.dumps([{"id": r.id, "name": r.name, "base_model": r.base_model, "kind": r.kind,
                                "path": r.path, "dataset_id": r.dataset_id, "dataset_hash": r.dataset_hash,
                                "created_at": r.created_at.isoformat(), "config": r.config, "metrics": r.metrics,
                                "evaluation": r.evaluation} for r in rows], indent=2))
        return
    if not rows:
        click.echo("no models yet: `tracemill train --config FILE` registers one")
        return
    table = Table(title="reviser models (eval split: model | rules)")
    for column in ("name", "kind", "base", "dataset", "verified ok", "reference match", "valid changed", "created"):
        table.add_column(column)
    for r in rows:
        pair = [f"{_figure(r.evaluation, 'eval', 'model', k)} | {_figure(r.evaluation, 'eval', 'rules', k)}"
                for k in ("ok_rate", "reference_match", "valid_changed")]
        table.add_row(r.name, r.kind, r.base_model, (r.dataset_hash or "-")[:12], *pair,
                      r.created_at.strftime("%Y-%m-%d %H:%M"))
    print_table(table)
