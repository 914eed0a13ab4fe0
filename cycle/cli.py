"""`tracemill cycle`: one iteration of the retrain-and-deploy cycle, `--every 24h` in the foreground, or
`--history`."""

from __future__ import annotations

import json
import re
import signal
import threading
from pathlib import Path
from typing import Any

import click

from tracemill.store.cli import database_option, resolve_db

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_every(value: str) -> float:
    """`90s`, `30m`, `24h`, `7d` (or a sum: `1h30m`) in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", value.strip().lower())
    if not parts or "".join(n + u for n, u in parts) != value.strip().lower().replace(" ", ""):
        raise click.BadParameter(f"{value!r} is not a period: use e.g. 90s, 30m, 24h, 7d", param_hint="--every")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise click.BadParameter("the period must be longer than 0", param_hint="--every")
    return seconds


@click.command("cycle")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="A TOML file: [cycle] (base, work, decision and gate settings), [mine] (how new calls are "
                   "exported) and any train config section ([grpo], [warmup], [eval], ...). See the README.")
@database_option
@click.option("--base", default=None, help="The model a candidate is trained from (a local folder or a hub id).")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where each cycle's dataset and model go (default: ./cycles).")
@click.option("--force", is_flag=True, default=None, help="Train whatever the decision says (the gate still holds).")
@click.option("--every", "every", default=None, metavar="PERIOD",
              help="Run a cycle now and then every PERIOD (30m, 24h, ...), in the foreground; Ctrl-C stops.")
@click.option("--history", is_flag=True, help="Show the cycles run so far: data mined, decision, candidate, "
              "deployed or not, and why.")
@click.option("--limit", type=click.IntRange(1), default=20, show_default=True, help="--history: the newest N.")
@click.option("--json", "as_json", is_flag=True, help="Print the cycle's record (or the history) as JSON.")
def cycle(config_path: Path | None, db_url: str | None, base: str | None, work: Path | None, force: bool | None,
          every: str | None, history: bool, limit: int, as_json: bool) -> None:
    """Mine what is new, decide whether to train (enough new failures, and harness tuning no longer paying), train a
    candidate reviser, measure it against the active one on the same held-out cases, and deploy it only when it is
    better by the gate's margins and changes no valid call. Every step is recorded in the store's `cycles` table; a
    lock in the store keeps two cycles from overlapping."""
    if history:
        _history(db_url, limit, as_json)
        return
    settings = _settings(config_path, resolve_db(db_url), base, work, force)
    if every is None:
        _once(settings, as_json)
        return
    _every(settings, parse_every(every), as_json)


def _settings(config_path: Path | None, store: str, base: str | None, work: Path | None, force: bool | None) -> Any:
    from tracemill.cycle.settings import CycleSettings, load_settings
    from tracemill.trainer.config import ConfigError

    overrides = {"base": base, "work": str(work.resolve()) if work else None, "force": force}
    try:
        if config_path is not None:
            return load_settings(config_path, store, overrides)
        if base is None:
            raise click.UsageError("give --base MODEL (or a --config file with [cycle] base)")
        return CycleSettings(store=store, work=(work or Path("cycles")).resolve(), base_model=base,
                             force=bool(force))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _once(settings: Any, as_json: bool) -> None:
    from tracemill.cycle.run import CycleBusy, CycleError, run_cycle
    from tracemill.store.queries import StoreBusyError

    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    try:
        done = run_cycle(settings, progress=say)
    except CycleBusy as exc:
        raise click.ClickException(f"{exc}: not starting a second cycle") from None
    except (CycleError, StoreBusyError) as exc:  # a failed cycle's whole error is in its record
        raise click.ClickException(_first_line(exc)) from None
    except KeyboardInterrupt:
        click.echo("stopped: the cycle is recorded as interrupted; the active deployment is as it was", err=True)
        raise SystemExit(130) from None
    if as_json:
        click.echo(json.dumps(done.to_dict(), indent=2))
    else:
        click.echo(_summary(done))


def _every(settings: Any, period: float, as_json: bool) -> None:
    """A cycle now, then one every `period` seconds (counted from each start) until Ctrl-C or SIGTERM; a busy lock
    or a failure skips that turn."""
    import time

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also where it was started with SIGINT ignored (`&`)
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                _once(settings, as_json)
            except click.ClickException as exc:  # a failed cycle, recorded as such, or a busy lock
                click.echo(f"cycle: {exc.message}", err=True)
            except Exception as exc:  # before a cycle could start (the store out of reach): the next turn tries again
                click.echo(f"cycle: {type(exc).__name__}: {_first_line(exc)}", err=True)
            wait = max(0.0, period - (time.monotonic() - started))
            click.echo(f"next cycle in {wait / 3600:.2f} h (Ctrl-C stops)", err=True)
            stop.wait(wait)
    except KeyboardInterrupt:
        pass
    click.echo("stopped", err=True)


def _first_line(exc: Exception) -> str:
    return next(iter(str(exc).splitlines()), "")


def _summary(done: Any) -> str:
    lines = [(f"cycle {done.id}: {done.status}; {done.new_calls} new calls, {done.new_failures} failed; "
              f"decision {done.decision or '-'}: {done.reason or '-'}")]
    if done.gate:
        lines.append(f"gate: {done.gate['reason']}")
    lines.append(f"deployed: {'yes (deployment ' + str(done.deployment_id) + ')' if done.deployed else 'no'}")
    return "\n".join(lines)


def _history(db_url: str | None, limit: int, as_json: bool) -> None:
    from rich.table import Table
    from sqlalchemy import select

    from tracemill.console import print_table
    from tracemill.cycle.record import history
    from tracemill.rates import percent
    from tracemill.store.cli import open_store
    from tracemill.store.tables import DatasetRow, ModelRow

    engine = open_store(db_url)
    with engine.connect() as conn:
        rows = history(conn, limit)
        models = dict(conn.execute(select(ModelRow.id, ModelRow.name)).all())
        datasets = dict(conn.execute(select(DatasetRow.id, DatasetRow.train_rows + DatasetRow.eval_rows)).all())
    engine.dispose()
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    if not rows:
        click.echo("no cycles yet: `tracemill cycle --base MODEL` runs one")
        return
    table = Table(title="cycles (newest first; held-out figures: candidate | baseline)")
    for column in ("id", "started", "status", "new calls / failed", "rows mined", "decision", "candidate",
                   "reference match", "schema compliance", "deployed", "why"):
        table.add_column(column)
    for r in rows:
        held = r.figures.get("eval") or {}
        pair = [f"{percent(held['candidate'].get(k))} | {percent(held['baseline'].get(k))}" if held else "-"
                for k in ("reference_match", "input_schema_compliance")]
        why = r.error if r.status != "done" else (r.gate.get("reason") if r.gate else r.reason)
        table.add_row(str(r.id), f"{r.started_at:%Y-%m-%d %H:%M}", r.status, f"{r.new_calls} / {r.new_failures}",
                      str(datasets.get(r.dataset_id, "-")), r.decision or "-", models.get(r.model_id, "-"), *pair,
                      "yes" if r.deployed else "no", why or "-")
    print_table(table)
