"""The OTLP/HTTP receiver (`POST /v1/traces`, `GET /healthz`), answering as the OTLP specification says.

This process reads requests and answers them; the work of a request (decoding, verifying, committing) is done by the
ingest processes (`collector.worker`), whichever is free, so that every core works and a request never waits behind
another's decoding in a busy process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import orjson
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tracemill.collector.body import Busy, InFlight, TooSlow, read_body
from tracemill.collector.decode import DECODERS, PayloadError
from tracemill.collector.ingest import Ingestor, QueueFull
from tracemill.collector.keys import KeyChecker
from tracemill.collector.worker import BodyTooLarge, NotStored, Stored, WorkerConfig
from tracemill.store.engine import make_engine, ping
from tracemill.store.errors import StoreUnavailable

_INVALID_ARGUMENT = 3
_DEADLINE_EXCEEDED = 4
_UNAUTHENTICATED = 16
_UNAVAILABLE = 14
_RESOURCE_EXHAUSTED = 8


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    database_url: str
    ingest_processes: int
    max_body_bytes: int
    max_attribute_bytes: int
    max_queued_spans: int
    retry_after_seconds: int
    max_inflight_bytes: int
    body_read_timeout_seconds: float


def _is_json(content_type: str) -> bool:
    """Answer in JSON unless the request was protobuf: a client that sent something else reads JSON best."""
    return content_type not in ("application/x-protobuf", "application/protobuf")


def _status(http: int, code: int, message: str, json_body: bool, headers: dict[str, str] | None = None) -> Response:
    if json_body:
        return JSONResponse({"code": code, "message": message}, status_code=http, headers=headers)
    return Response(Status(code=code, message=message).SerializeToString(), status_code=http,
                    media_type="application/x-protobuf", headers=headers)


def _success(stored: Stored, json_body: bool) -> Response:
    rejected, reasons = stored.rejected, stored.reasons
    message = "; ".join(reasons[:5]) + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else "")
    if json_body:
        body = {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}} if rejected else {}
        return Response(orjson.dumps(body), media_type="application/json")
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    return Response(response.SerializeToString(), media_type="application/x-protobuf")


def app_from_settings(database_url: str | None = None, ingest_processes: int | None = None) -> Starlette:
    """The app as configured by the settings (TRACEMILL_* variables), for `uvicorn --factory` as much as for
    `tracemill collector`."""
    from tracemill.settings import get_settings

    settings = get_settings()
    return create_app(CollectorConfig(
        database_url=database_url or settings.database_url,
        ingest_processes=ingest_processes or settings.collector_workers,
        max_body_bytes=settings.max_body_bytes, max_attribute_bytes=settings.max_attribute_bytes,
        max_queued_spans=settings.ingest_queue_spans, retry_after_seconds=settings.retry_after_seconds,
        max_inflight_bytes=settings.max_inflight_bytes, body_read_timeout_seconds=settings.body_read_timeout_seconds,
    ))


def create_app(config: CollectorConfig) -> Starlette:
    ingestor = Ingestor(WorkerConfig(config.database_url, config.max_body_bytes, config.max_attribute_bytes),
                        config.ingest_processes, config.max_queued_spans)
    keys_engine = make_engine(config.database_url)
    keys = KeyChecker(keys_engine)
    retry_after = {"Retry-After": str(config.retry_after_seconds)}
    inflight = InFlight(config.max_inflight_bytes)

    def busy(reason: str, json_body: bool, headers: dict[str, str] | None = None) -> Response:
        return _status(503, _UNAVAILABLE, f"collector is busy ({reason}); retry later", json_body,
                       {**retry_after, **(headers or {})})

    def store_unavailable(exc: Exception, json_body: bool) -> Response:
        return _status(503, _UNAVAILABLE, f"the store is unavailable ({exc}); retry later", json_body, retry_after)

    async def traces(request: Request) -> Response:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        json_body = _is_json(content_type)
        try:
            refusal = await asyncio.to_thread(keys.check, request.headers.get("authorization"))
        except StoreUnavailable as exc:
            return store_unavailable(exc, json_body)
        if refusal:
            return _status(401, _UNAUTHENTICATED, refusal, json_body)
        if content_type not in DECODERS:
            return _status(415, _INVALID_ARGUMENT, f"Content-Type {content_type or '(none)'!r} is not supported: "
                           "send application/x-protobuf or application/json", json_body)
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("gzip", "identity", ""):
            return _status(415, _INVALID_ARGUMENT, f"Content-Encoding {encoding!r} is not supported: "
                           "send gzip or none", json_body)
        try:  # before the body is read: under overload, refusing costs next to nothing
            reservation = ingestor.reserve()
        except QueueFull as exc:
            return busy(str(exc), json_body)
        try:
            body = await read_body(request, config.max_body_bytes, inflight, config.body_read_timeout_seconds)
            stored = await ingestor.ingest(body, content_type, encoding == "gzip")
        except Busy as exc:  # the rest of the body is not wanted: closing spares reading it
            return busy(str(exc), json_body, {"Connection": "close"})
        except TooSlow as exc:
            return _status(408, _DEADLINE_EXCEEDED, str(exc), json_body, {"Connection": "close"})
        except BodyTooLarge as exc:
            return _status(413, _RESOURCE_EXHAUSTED, str(exc), json_body)
        except PayloadError as exc:
            return _status(400, _INVALID_ARGUMENT, str(exc), json_body)
        except NotStored as exc:
            return _status(503, _UNAVAILABLE, f"spans could not be stored ({exc}); retry later (spans sent again "
                           "are stored once)", json_body, retry_after)
        finally:
            ingestor.release(reservation)
        return _success(stored, json_body)

    async def healthz(_: Request) -> Response:
        try:
            await asyncio.to_thread(ping, keys_engine)
        except StoreUnavailable as exc:
            return JSONResponse({"status": f"the store is unavailable ({exc})", "queued_spans": ingestor.queued_spans},
                                status_code=503, headers=retry_after)
        return JSONResponse({"status": "ok", "queued_spans": ingestor.queued_spans})

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await ingestor.start()
        try:
            yield
        finally:
            await asyncio.to_thread(ingestor.close)
            keys_engine.dispose()

    return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"]), Route("/healthz", healthz)],
                     lifespan=lifespan)
