"""One OTLP export, whichever transport brought it (`collector.app` for OTLP/HTTP, `collector.grpc_receiver` for
OTLP/gRPC): the key checked, room reserved before the body is read, the body committed by an ingest process before
the answer. Every refusal is a `Refused` with its gRPC status code (OTLP/HTTP sends the same code in its Status body)
and the HTTP status OTLP/HTTP answers with."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tracemill.collector.body import Busy, TooSlow
from tracemill.collector.decode import PayloadError
from tracemill.collector.ingest import Ingestor, QueueFull
from tracemill.collector.keys import KeyChecker
from tracemill.collector.worker import BodyTooLarge, NotStored, Stored
from tracemill.store.errors import StoreUnavailable

INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
UNAVAILABLE = 14
UNAUTHENTICATED = 16


class Refused(Exception):
    def __init__(self, http: int, code: int, message: str, retry: bool = False, close: bool = False) -> None:
        super().__init__(message)
        self.http, self.code, self.message = http, code, message
        self.retry = retry  # worth a retry later: OTLP/HTTP adds Retry-After
        self.close = close  # the rest of the body is not wanted: OTLP/HTTP closes the connection


def busy(reason: str, close: bool = False) -> Refused:
    return Refused(503, UNAVAILABLE, f"collector is busy ({reason}); retry later", retry=True, close=close)


class Exporter:
    def __init__(self, ingestor: Ingestor, keys: KeyChecker) -> None:
        self.ingestor = ingestor
        self.keys = keys

    async def check_key(self, authorization: str | None) -> None:
        try:
            refusal = await asyncio.to_thread(self.keys.check, authorization)
        except StoreUnavailable as exc:
            raise Refused(503, UNAVAILABLE, f"the store is unavailable ({exc}); retry later", retry=True) from None
        if refusal:
            raise Refused(401, UNAUTHENTICATED, refusal)

    async def export(
        self, read: Callable[[], Awaitable[bytes]], content_type: str, gzipped: bool, logs: bool = False
    ) -> Stored:
        """Reads the body with `read` once room is reserved (under overload, refusing costs next to nothing), then
        has it committed. `logs`: the body is an ExportLogsServiceRequest."""
        try:
            reservation = self.ingestor.reserve()
        except QueueFull as exc:
            raise busy(str(exc)) from None
        try:
            body = await read()
            return await self.ingestor.ingest(body, content_type, gzipped, logs)
        except REFUSED as exc:
            raise as_refusal(exc, "log records" if logs else "spans") from None
        finally:
            self.ingestor.release(reservation)


REFUSED = (Busy, TooSlow, BodyTooLarge, PayloadError, NotStored)


def as_refusal(exc: Exception, what: str = "spans") -> Refused:
    """The answer to one of `REFUSED`, raised while a body was read or committed."""
    if isinstance(exc, Busy):  # the rest of the body is not wanted: closing spares reading it
        return busy(str(exc), close=True)
    if isinstance(exc, TooSlow):
        return Refused(408, DEADLINE_EXCEEDED, str(exc), close=True)
    if isinstance(exc, BodyTooLarge):
        return Refused(413, RESOURCE_EXHAUSTED, str(exc))
    if isinstance(exc, PayloadError):
        return Refused(400, INVALID_ARGUMENT, str(exc))
    return Refused(
        503,
        UNAVAILABLE,
        f"{what} could not be stored ({exc}); retry later ({what} sent again are stored once)",
        retry=True,
    )


def summary(reasons: list[str]) -> str:
    """A partial success's error message: the first reasons, and how many more."""
    return "; ".join(reasons[:5]) + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else "")


def export_response(stored: Stored, logs: bool) -> ExportTraceServiceResponse | ExportLogsServiceResponse:
    """The OTLP answer to an export: a partial success when anything was rejected, or stored mended (a warning:
    nothing rejected)."""
    if logs:
        response: ExportTraceServiceResponse | ExportLogsServiceResponse = ExportLogsServiceResponse()
        if stored.rejected:
            response.partial_success.rejected_log_records = stored.rejected
    else:
        response = ExportTraceServiceResponse()
        if stored.rejected:
            response.partial_success.rejected_spans = stored.rejected
    if stored.reasons:
        response.partial_success.error_message = summary(stored.reasons)
    return response
