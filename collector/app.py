"""The OTLP/HTTP receiver (`POST /v1/traces`, `POST /v1/logs`, `GET /healthz`; `POST /v1/metrics` answered, not
stored), answering as the OTLP specification says, and in its lifespan the OTLP/gRPC receiver
(`collector.grpc_receiver`) beside it.

This process reads requests and answers them; the work of a request (decoding, verifying, committing) is done by the
ingest processes (`collector.worker`), whichever is free, so that every core works and a request never waits behind
another's decoding in a busy process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import orjson
from google.rpc.status_pb2 import Status
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tracemill.collector.body import InFlight, read_body
from tracemill.collector.decode import DECODERS
from tracemill.collector.export import (
    INVALID_ARGUMENT,
    REFUSED,
    Exporter,
    Refused,
    as_refusal,
    export_response,
    summary,
)
from tracemill.collector.ingest import Ingestor
from tracemill.collector.keys import KeyChecker
from tracemill.collector.unstored import ROUTES, count_data_points, metrics_response
from tracemill.collector.worker import Stored, WorkerConfig, gunzip
from tracemill.store.engine import make_engine, ping
from tracemill.store.errors import StoreUnavailable

_NOT_FOUND = 5


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
    grpc_port: int | None = None  # None or 0: no OTLP/gRPC receiver
    grpc_host: str = "127.0.0.1"


def _is_json(content_type: str) -> bool:
    """Answer in JSON unless the request was protobuf: a client that sent something else reads JSON best."""
    return content_type not in ("application/x-protobuf", "application/protobuf")


def _status(http: int, code: int, message: str, json_body: bool, headers: dict[str, str] | None = None) -> Response:
    if json_body:
        return JSONResponse({"code": code, "message": message}, status_code=http, headers=headers)
    return Response(Status(code=code, message=message).SerializeToString(), status_code=http,
                    media_type="application/x-protobuf", headers=headers)


def _success(stored: Stored, json_body: bool, logs: bool) -> Response:
    if json_body:
        key = "rejectedLogRecords" if logs else "rejectedSpans"
        body = ({"partialSuccess": {key: str(stored.rejected), "errorMessage": summary(stored.reasons)}}
                if stored.reasons else {})
        return Response(orjson.dumps(body), media_type="application/json")
    return Response(export_response(stored, logs).SerializeToString(), media_type="application/x-protobuf")


def _refused(refused: Refused, json_body: bool, retry_after: dict[str, str]) -> Response:
    headers = {**(retry_after if refused.retry else {}), **({"Connection": "close"} if refused.close else {})}
    return _status(refused.http, refused.code, refused.message, json_body, headers)


def app_from_settings(database_url: str | None = None, ingest_processes: int | None = None,
                      grpc_port: int | None = None, host: str | None = None) -> Starlette:
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
        grpc_port=settings.collector_grpc_port if grpc_port is None else grpc_port,
        grpc_host=host or settings.collector_host,
    ))


def create_app(config: CollectorConfig) -> Starlette:
    ingestor = Ingestor(WorkerConfig(config.database_url, config.max_body_bytes, config.max_attribute_bytes),
                        config.ingest_processes, config.max_queued_spans)
    keys_engine = make_engine(config.database_url)
    exporter = Exporter(ingestor, KeyChecker(keys_engine))
    retry_after = {"Retry-After": str(config.retry_after_seconds)}
    inflight = InFlight(config.max_inflight_bytes)

    async def accepted(request: Request) -> tuple[str, bool]:
        """The request's content type and whether it is gzipped, once its key and headers are acceptable."""
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        await exporter.check_key(request.headers.get("authorization"))
        if content_type not in DECODERS:
            raise Refused(415, INVALID_ARGUMENT, f"Content-Type {content_type or '(none)'!r} is not supported: "
                          "send application/x-protobuf or application/json")
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("gzip", "identity", ""):
            raise Refused(415, INVALID_ARGUMENT, f"Content-Encoding {encoding!r} is not supported: send gzip or none")
        return content_type, encoding == "gzip"

    def receiver(logs: bool) -> Callable[[Request], Awaitable[Response]]:
        async def receive(request: Request) -> Response:
            json_body = _is_json(request.headers.get("content-type", "").split(";")[0].strip().lower())
            try:
                content_type, gzipped = await accepted(request)
                stored = await exporter.export(
                    lambda: read_body(request, config.max_body_bytes, inflight, config.body_read_timeout_seconds),
                    content_type, gzipped, logs)
            except Refused as refused:
                return _refused(refused, json_body, retry_after)
            return _success(stored, json_body, logs)
        return receive

    async def metrics(request: Request) -> Response:
        json_body = _is_json(request.headers.get("content-type", "").split(";")[0].strip().lower())
        try:
            _, gzipped = await accepted(request)
            body = await read_body(request, config.max_body_bytes, inflight, config.body_read_timeout_seconds)
            if gzipped:
                body = await asyncio.to_thread(gunzip, body, config.max_body_bytes)
            points = await asyncio.to_thread(count_data_points, body, not json_body)
        except Refused as refused:
            return _refused(refused, json_body, retry_after)
        except REFUSED as exc:
            return _refused(as_refusal(exc), json_body, retry_after)
        return Response(metrics_response(points, json_body),
                        media_type="application/json" if json_body else "application/x-protobuf")

    async def healthz(_: Request) -> Response:
        try:
            await asyncio.to_thread(ping, keys_engine)
        except StoreUnavailable as exc:
            return JSONResponse({"status": f"the store is unavailable ({exc})", "queued_spans": ingestor.queued_spans},
                                status_code=503, headers=retry_after)
        return JSONResponse({"status": "ok", "queued_spans": ingestor.queued_spans})

    async def elsewhere(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        what = "is not a path" if status == 404 else f"does not take {request.method}"
        return _status(status, _NOT_FOUND if status == 404 else INVALID_ARGUMENT,
                       f"{request.url.path} {what}: {ROUTES}", True)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        from tracemill.collector.grpc_receiver import start_grpc

        await ingestor.start()
        grpc_server = None
        try:
            if config.grpc_port:
                grpc_server = await start_grpc(exporter, inflight, config.grpc_host, config.grpc_port,
                                               config.max_body_bytes)
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop(grace=30)
            await asyncio.to_thread(ingestor.close)
            keys_engine.dispose()

    return Starlette(routes=[Route("/v1/traces", receiver(logs=False), methods=["POST"]),
                             Route("/v1/logs", receiver(logs=True), methods=["POST"]),
                             Route("/v1/metrics", metrics, methods=["POST"]),
                             Route("/healthz", healthz)],
                     exception_handlers={404: elsewhere, 405: elsewhere}, lifespan=lifespan)
