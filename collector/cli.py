"""`tracemill collector` and `tracemill keys`."""

from __future__ import annotations

import click

from tracemill.store.cli import database_option, open_store, read_store, resolve_db


@click.command()
@click.option("--host", default=None, help="Interface to listen on (default 127.0.0.1).")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port (default 4318, OTLP/HTTP's; 0: one the system picks, logged at start).")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None,
              help="OTLP/gRPC port (default 4317, OTLP/gRPC's; 0: no gRPC receiver).")
@database_option
@click.option("--workers", type=click.IntRange(1), default=None,
              help="Ingest processes: each decodes, verifies and commits whole requests, taking turns to write "
                   "(default: one per core, up to 8).")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]))
def collector(host: str | None, port: int | None, grpc_port: int | None, db_url: str | None, workers: int | None,
              log_level: str) -> None:
    """Run the OTLP collector: over HTTP, POST /v1/traces and /v1/logs (protobuf or JSON, gzip), GET /healthz; over
    gRPC, TraceService and LogsService. Metrics are answered, not stored.

    Every span and GenAI log event is committed before it is acknowledged; re-sent ones are stored once. Limits come
    from TRACEMILL_MAX_BODY_BYTES, TRACEMILL_MAX_ATTRIBUTE_BYTES, TRACEMILL_INGEST_QUEUE_SPANS."""
    import uvicorn

    from tracemill.collector.app import app_from_settings
    from tracemill.settings import get_settings

    settings = get_settings()
    url = resolve_db(db_url)
    open_store(url).dispose()
    grpc_port = settings.collector_grpc_port if grpc_port is None else grpc_port
    if grpc_port:
        _check_free(host or settings.collector_host, grpc_port)
    uvicorn.run(app_from_settings(url, workers, grpc_port, host), host=host or settings.collector_host,
                port=settings.collector_port if port is None else port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=30)


def _check_free(host: str, port: int) -> None:
    """Says at once, before the collector starts, that the gRPC port is taken."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise click.ClickException(f"cannot listen for OTLP/gRPC on {host}:{port} ({exc.strerror}): choose "
                                       "another port with --grpc-port, or --grpc-port 0 for none") from None


@click.group()
def keys() -> None:
    """Manage collector API keys. Once any key has been created, the collector refuses requests without a valid,
    unrevoked one."""


@keys.command("create")
@click.option("--name", required=True, help="Who or what the key is for.")
@database_option
def create(name: str, db_url: str | None) -> None:
    """Create a key and print it (only this once)."""
    from tracemill.collector.keys import create_key

    row, key = create_key(open_store(db_url), name)
    click.echo(key)
    click.echo(f"key {row.id} ({name}) created; it is shown only now", err=True)


@keys.command("list")
@database_option
def list_(db_url: str | None) -> None:
    """List keys (never the keys themselves)."""
    from tracemill.collector.keys import list_keys

    for row in list_keys(read_store(db_url)):
        state = f"revoked {row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "active"
        click.echo(f"{row.id}\t{row.prefix}…\t{row.name}\t{row.created_at:%Y-%m-%d %H:%M}Z\t{state}")


@keys.command("revoke")
@click.argument("key_id", type=int)
@database_option
def revoke(key_id: int, db_url: str | None) -> None:
    """Revoke key KEY_ID (see `keys list`)."""
    from tracemill.collector.keys import revoke_key

    if not revoke_key(read_store(db_url), key_id):
        raise click.ClickException(f"no active key with id {key_id}")
    click.echo(f"key {key_id} revoked")
