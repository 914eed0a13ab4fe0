"""The OTLP/gRPC receiver (`TraceService/Export`, `LogsService/Export`; port 4317 by default), beside OTLP/HTTP in the
collector's process and on its event loop, sharing its ingest processes, limits and key check (`collector.export`).

A request is answered only once its spans or log records are committed; a partial success says what was rejected, as
over HTTP. Refusals carry the gRPC code OTLP/HTTP puts in its Status body: UNAUTHENTICATED, INVALID_ARGUMENT (not a
request, or malformed), RESOURCE_EXHAUSTED (over the size limit, which grpc itself also enforces on the message),
UNAVAILABLE (busy, or the store is: OTLP exporters retry it). gRPC receives a message whole before the collector
sees it: messages count against the in-flight byte budget from then until their commit, and one that does not fit
while others hold it is refused as busy. `MetricsService/Export` is answered as `/v1/metrics` is
(`collector.unstored`).

The handlers take and return raw bytes, so that decoding happens in an ingest process, as for HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from tracemill.collector.body import InFlight
from tracemill.collector.export import REFUSED, Exporter, Refused, as_refusal, busy, export_response
from tracemill.collector.unstored import count_data_points, metrics_response

_TRACES = "opentelemetry.proto.collector.trace.v1.TraceService"
_LOGS = "opentelemetry.proto.collector.logs.v1.LogsService"
_METRICS = "opentelemetry.proto.collector.metrics.v1.MetricsService"
_CODES = {code.value[0]: code for code in grpc.StatusCode}

Handler = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


async def start_grpc(exporter: Exporter, inflight: InFlight, host: str, port: int, max_bytes: int) -> grpc.aio.Server:
    """Listens on host:port and serves until `stop`; OSError when the port cannot be had."""
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", max_bytes), ("grpc.max_send_message_length", 4 * 1024 * 1024)]
    )
    handlers = {
        _TRACES: _export_handler(exporter, inflight, logs=False),
        _LOGS: _export_handler(exporter, inflight, logs=True),
        _METRICS: _metrics_handler(exporter),
    }
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(service, {"Export": grpc.unary_unary_rpc_method_handler(handler)})
            for service, handler in handlers.items()
        ]
    )
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:
        raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}: {exc}") from None
    if not bound:
        raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}")
    await server.start()
    return server


def _authorization(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode()
    return None


async def _abort(context: grpc.aio.ServicerContext, refused: Refused) -> None:
    await context.abort(_CODES[refused.code], refused.message)


def _export_handler(exporter: Exporter, inflight: InFlight, logs: bool) -> Handler:
    async def export(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            await exporter.check_key(_authorization(context))
            if not inflight.take(0, len(body)):
                raise busy(f"{inflight.used} bytes of requests are being read")
        except Refused as refused:
            await _abort(context, refused)
        try:
            stored = await exporter.export(_ready(body), "application/x-protobuf", False, logs)
        except Refused as refused:
            await _abort(context, refused)
        finally:
            inflight.give_back(len(body))
        return export_response(stored, logs).SerializeToString()

    return export


def _metrics_handler(exporter: Exporter) -> Handler:
    async def export(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            await exporter.check_key(_authorization(context))
            points = await asyncio.to_thread(count_data_points, body, True)
        except Refused as refused:
            await _abort(context, refused)
        except REFUSED as exc:
            await _abort(context, as_refusal(exc))
        return metrics_response(points, json_body=False)

    return export


def _ready(body: bytes) -> Callable[[], Awaitable[bytes]]:
    async def read() -> bytes:
        return body

    return read
