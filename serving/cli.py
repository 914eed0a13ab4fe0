"""`tracemill serve`, `tracemill deploy`, `tracemill rollback`, `tracemill deployments`."""

from __future__ import annotations

import getpass
import json

import click

from tracemill.store.cli import database_option, open_store, resolve_db, store_errors


def _actor() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _store(db_url: str | None, write: bool):  # type: ignore[no-untyped-def]
    """The store's engine: migrated for writing where it is a SQLite file (`open_store`); for reading, never created."""
    from tracemill.store.engine import make_engine
    from tracemill.store.migrate import current_revision

    if write:
        return open_store(db_url)
    engine = make_engine(resolve_db(db_url), must_exist=True)
    with store_errors(engine):
        known = current_revision(engine) is not None
    if not known:
        raise click.ClickException(f"no Tracemill store at {engine.url.render_as_string(hide_password=True)} "
                                   "(start the collector on it, or run `tracemill db upgrade`)")
    return engine


@click.command()
@click.option("--upstream", required=True, metavar="BASE_URL",
              help="The model server's OpenAI base URL, as an OpenAI client takes it (http://127.0.0.1:8001/v1).")
@click.option("--host", default=None, help="Interface to listen on (default 127.0.0.1; 0.0.0.0 for every one).")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port (default 8000; 0: one the system picks, logged at start).")
@click.option("--reviser", "spec", default="rules", show_default=True,
              help="What revises until a deployment says otherwise: rules | endpoint:URL | model:PATH | none.")
@database_option
@click.option("--vllm", "vllm_url", metavar="BASE_URL",
              help="A vLLM server (started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=true) that serves "
                   "deployed versions as LoRA adapters; often the upstream itself. Without it a deployed version "
                   "runs in this process (model:PATH).")
@click.option("--collector", metavar="URL", help="Trace every request to this collector (default: "
              "TRACEMILL_SERVE_COLLECTOR; none: no tracing).")
@click.option("--no-messages", is_flag=True, help="Trace without the conversation (tools, output and calls only).")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=None,
              help="Seconds to wait for the upstream (default 300).")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]))
def serve(upstream: str, host: str | None, port: int | None, spec: str, db_url: str | None, vllm_url: str | None,
          collector: str | None, no_messages: bool, timeout: float | None, log_level: str) -> None:
    """Run the reviser sidecar: an OpenAI-compatible proxy in front of any model server that turns broken tool calls
    into valid ones before the agent sees them.

    It follows the deployments of the store (--db): `tracemill deploy` and `tracemill rollback` take effect without
    a restart. With --collector, an agent that sends its harness version (header X-Tracemill-Harness-Version) gets it
    recorded with the model's answers as sent, where `tracemill cycle` rates harness versions."""
    import logging

    import uvicorn

    try:
        from tracemill.serving.app import ServeConfig, create_app
    except ImportError as exc:
        raise click.ClickException(f"{exc}: `tracemill serve` needs pip install 'tracemill[serving]'") from None
    from tracemill.revisers import ReviserSpecError
    from tracemill.settings import get_settings

    settings = get_settings()
    collector = collector or settings.serve_collector
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if collector:
        import tracemill.sdk as tm
        from tracemill.store.queries import SIDECAR_SERVICE

        tm.init(collector, service_name=SIDECAR_SERVICE, capture_messages=not no_messages)
    config = ServeConfig(upstream, spec, resolve_db(db_url), vllm_url, settings.serve_poll_seconds,
                         timeout or settings.serve_timeout_seconds, trace=bool(collector))
    try:
        app = create_app(config)
    except ReviserSpecError as exc:
        raise click.UsageError(str(exc)) from None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--upstream") from None
    uvicorn.run(app, host=host or settings.serve_host, port=settings.serve_port if port is None else port,
                log_level=log_level, access_log=False, timeout_graceful_shutdown=10)


@click.command()
@click.argument("model")
@click.option("--canary", type=click.FloatRange(0, 100, min_open=True), metavar="PERCENT",
              help="Send this share of conversations to the version (sticky per conversation); the rest stay with "
                   "the active one.")
@click.option("--actor", default=None, help="Who deploys (default: your user name).")
@click.option("--note", default=None, help="Why, in a sentence; kept with the model's eval figures.")
@database_option
def deploy(model: str, canary: float | None, actor: str | None, note: str | None, db_url: str | None) -> None:
    """Make MODEL (a models id or name, or `rules`) the active reviser version, or with --canary its candidate.

    Making a version active ends a running canary. Running sidecars pick the change up without a restart."""
    from tracemill.serving.deployments import DeployError
    from tracemill.serving.deployments import deploy as run_deploy

    engine = _store(db_url, write=True)
    try:
        rows = run_deploy(engine, model, actor or _actor(), canary, note)
    except DeployError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        engine.dispose()
    share = f" for {canary:g} % of conversations" if canary is not None else ""
    click.echo(f"deployment {rows[-1].id}: {model} {'canary' if canary is not None else 'active'}{share}")


@click.command()
@click.option("--actor", default=None, help="Who rolls back (default: your user name).")
@click.option("--note", default=None, help="Why, in a sentence.")
@database_option
def rollback(actor: str | None, note: str | None, db_url: str | None) -> None:
    """End the running canary; without one, go back to the version active before the current one."""
    from sqlalchemy.orm import Session

    from tracemill.serving.deployments import DeployError, served
    from tracemill.serving.deployments import rollback as run_rollback

    engine = _store(db_url, write=True)
    try:
        row = run_rollback(engine, actor or _actor(), note)
        with Session(engine) as conn:
            state = served(conn)
    except DeployError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        engine.dispose()
    ended = "canary ended" if row.role == "canary" else "rolled back"
    click.echo(f"deployment {row.id}: {ended}; {state.active.name} is active")


@click.command()
@click.option("--limit", type=click.IntRange(1), default=20, show_default=True, help="The newest N.")
@click.option("--json", "as_json", is_flag=True, help="Print the state and the history as JSON.")
@database_option
def deployments(limit: int, as_json: bool, db_url: str | None) -> None:
    """What the sidecars serve, and the history of deployments (who, when, why)."""
    from sqlalchemy.orm import Session

    from tracemill.serving.deployments import history, served

    engine = _store(db_url, write=False)
    with Session(engine) as conn:
        state = served(conn)
        rows = history(conn, limit)
    engine.dispose()
    canary = ({"version": state.canary.name, "percent": state.canary_percent} if state.canary else None)
    if as_json:
        click.echo(json.dumps({"active": state.active.name, "canary": canary,
                               "history": [r.to_dict() for r in rows]}, indent=2, default=str))
        return
    from rich.table import Table

    from tracemill.console import print_table

    serving = f"{state.active.name} active" + (f", {state.canary.name} canary at {state.canary_percent:g} %"
                                               if state.canary else "")
    table = Table(title=f"serving: {serving}")
    for column in ("id", "when (UTC)", "action", "role", "version", "share", "actor", "why"):
        table.add_column(column)
    for r in rows:
        why = r.justification.get("note") or ", ".join(f"{k}" for k in r.justification) or ""
        table.add_row(str(r.id), r.created_at, r.action, r.role, r.version or "—",
                      f"{r.canary_percent:g} %" if r.canary_percent is not None else "", r.actor, why)
    print_table(table)
