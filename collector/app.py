"""The OTLP/HTTP receiver (`POST /v1/traces`, `GET /healthz`), answering as the OTLP specification says."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import orjson
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tracemill.collector.decode import DECODERS, Decoded, Limits, PayloadError
from tracemill.collector.ingest import Ingestor, QueueFull
from tracemill.collector.keys import KeyChecker

_INVALID_ARGUMENT = 3
_UNAUTHENTICATED = 16
_UNAVAILABLE = 14
_RESOURCE_EXHAUSTED = 8


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    max_body_bytes: int
    max_attribute_bytes: int
    max_queued_spans: int
    max_batch_spans: int
    retry_after_seconds: int
    max_inflight_bytes: int


class _TooLarge(Exception):
    pass


class _InFlight:
    """Bytes of request bodies being read and decoded now: bounded, so that a crowd of exporters cannot make the
    collector hold more than the budget before the queue can refuse them."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used and self.used + size > self.budget:
            return False
        self.used += size
        return True

    def give_back(self, size: int) -> None:
        self.used -= size


def _is_json(content_type: str) -> bool:
    """Answer in JSON unless the request was protobuf: a client that sent something else reads JSON best."""
    return content_type not in ("application/x-protobuf", "application/protobuf")


def _status(http: int, code: int, message: str, json_body: bool, headers: dict[str, str] | None = None) -> Response:
    if json_body:
        return JSONResponse({"code": code, "message": message}, status_code=http, headers=headers)
    return Response(Status(code=code, message=message).SerializeToString(), status_code=http,
                    media_type="application/x-protobuf", headers=headers)


def _success(decoded: Decoded, json_body: bool) -> Response:
    rejected = len(decoded.rejected)
    message = "; ".join(decoded.rejected[:5]) + (f"; and {rejected - 5} more" if rejected > 5 else "")
    if json_body:
        body = {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}} if rejected else {}
        return Response(orjson.dumps(body), media_type="application/json")
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    return Response(response.SerializeToString(), media_type="application/x-protobuf")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _TooLarge(f"request body of {declared} bytes is over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _gunzip(body: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise _TooLarge(f"decompressed body is over the limit of {limit} bytes")
    if not inflater.eof:
        raise PayloadError("gzip body is truncated")
    return out


def app_from_settings() -> Starlette:
    """The app as configured by the settings (TRACEMILL_* variables): what each worker process of a multi-process
    collector builds for itself."""
    from tracemill.settings import get_settings
    from tracemill.store.engine import make_engine

    settings = get_settings()
    return create_app(make_engine(settings.database_url), CollectorConfig(
        max_body_bytes=settings.max_body_bytes, max_attribute_bytes=settings.max_attribute_bytes,
        max_queued_spans=settings.ingest_queue_spans, max_batch_spans=settings.ingest_batch_spans,
        retry_after_seconds=settings.retry_after_seconds, max_inflight_bytes=settings.max_inflight_bytes,
    ))


def _resolve(future: asyncio.Future[BaseException | None], error: BaseException | None) -> None:
    if not future.done():  # the client may have gone away; its spans are stored all the same
        future.set_result(error)


def create_app(engine: Engine, config: CollectorConfig) -> Starlette:
    ingestor = Ingestor(engine, config.max_queued_spans, config.max_batch_spans)
    keys = KeyChecker(engine)
    limits = Limits(max_attribute_bytes=config.max_attribute_bytes)
    retry_after = {"Retry-After": str(config.retry_after_seconds)}
    inflight = _InFlight(config.max_inflight_bytes)

    def busy(reason: str, json_body: bool) -> Response:
        return _status(503, _UNAVAILABLE, f"collector is busy ({reason}); retry later", json_body, retry_after)

    def queue_full(json_body: bool) -> Response:
        return busy(f"{ingestor.queued_spans} spans are waiting to be written", json_body)

    async def traces(request: Request) -> Response:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        json_body = _is_json(content_type)
        refusal = await asyncio.to_thread(keys.check, request.headers.get("authorization"))
        if refusal:
            return _status(401, _UNAUTHENTICATED, refusal, json_body)
        decoder = DECODERS.get(content_type)
        if decoder is None:
            return _status(415, _INVALID_ARGUMENT, f"Content-Type {content_type or '(none)'!r} is not supported: "
                           "send application/x-protobuf or application/json", json_body)
        if ingestor.full:
            return queue_full(json_body)
        declared = request.headers.get("content-length", "")
        reserved = min(int(declared), config.max_body_bytes) if declared.isdigit() else config.max_body_bytes
        if not inflight.take(reserved):
            return busy(f"{inflight.used} bytes of requests are being read", json_body)
        try:
            decoded = await _decode(request, decoder, json_body)
        finally:
            inflight.give_back(reserved)
        if isinstance(decoded, Response):
            return decoded
        if decoded.spans:
            loop = asyncio.get_running_loop()
            committed: asyncio.Future[BaseException | None] = loop.create_future()
            try:
                ingestor.submit(decoded.spans, lambda error: loop.call_soon_threadsafe(_resolve, committed, error))
            except QueueFull as exc:
                return busy(str(exc), json_body)
            error = await committed
            if error is not None:
                return _status(503, _UNAVAILABLE, f"spans could not be stored ({type(error).__name__}); nothing "
                               "from this request was kept, retry later", json_body, retry_after)
        return _success(decoded, json_body)

    async def _decode(request: Request, decoder: Callable[[bytes, Limits], Decoded],
                      json_body: bool) -> Decoded | Response:
        try:
            body = await _read_body(request, config.max_body_bytes)
            encoding = request.headers.get("content-encoding", "identity").strip().lower()
            if encoding == "gzip":
                try:
                    body = _gunzip(body, config.max_body_bytes)
                except zlib.error as exc:
                    raise PayloadError(f"body is not valid gzip: {exc}") from exc
            elif encoding not in ("identity", ""):
                return _status(415, _INVALID_ARGUMENT, f"Content-Encoding {encoding!r} is not supported: "
                               "send gzip or none", json_body)
            if ingestor.full:  # filled while the body arrived: refuse before paying for the decoding
                return queue_full(json_body)
            return decoder(body, limits)
        except _TooLarge as exc:
            return _status(413, _RESOURCE_EXHAUSTED, str(exc), json_body)
        except PayloadError as exc:
            return _status(400, _INVALID_ARGUMENT, str(exc), json_body)

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok", "queued_spans": ingestor.queued_spans})

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        ingestor.start()
        try:
            yield
        finally:
            await asyncio.to_thread(ingestor.close)

    return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"]), Route("/healthz", healthz)],
                     lifespan=lifespan)
