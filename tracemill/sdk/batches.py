"""Export requests bounded in bytes. The batch processor bounds a batch by its number of spans (512), and real agent
contexts reach 57k-128k tokens: 512 model-call spans with their conversations come to hundreds of MB, more than a
collector takes in one request (`max_body_bytes`, 32 MiB by default), and a refused request loses every span in it.
`SizedExporter` sends a batch as requests of about `max_bytes` each, sizing each span by what it carries."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

MAX_REQUEST_BYTES = 4 << 20
_SPAN_BYTES = 200  # ids, times, kind, status and the framing of a span
_FIELD_BYTES = 8  # the framing of an attribute and its value


def _value_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode())
    if isinstance(value, (list, tuple)):
        return sum(map(_value_bytes, value)) + _FIELD_BYTES * len(value)
    return _FIELD_BYTES


def _attributes_bytes(attributes: Any) -> int:
    return sum(len(key) + _FIELD_BYTES + _value_bytes(value) for key, value in (attributes or {}).items())


def span_bytes(span: ReadableSpan) -> int:
    """About what the span takes in an OTLP request: its strings, as UTF-8, and a little framing."""
    size = _SPAN_BYTES + len(span.name) + _attributes_bytes(span.attributes)
    for event in span.events:
        size += _SPAN_BYTES + len(event.name) + _attributes_bytes(event.attributes)
    for link in span.links:
        size += _SPAN_BYTES + _attributes_bytes(link.attributes)
    return size


def chunks(spans: Sequence[ReadableSpan], max_bytes: int) -> Iterator[Sequence[ReadableSpan]]:
    """The spans in order, as runs of `max_bytes` at most (a span larger than that alone)."""
    start, size = 0, 0
    for n, span in enumerate(spans):
        grown = size + span_bytes(span)
        if grown > max_bytes and n > start:
            yield spans[start:n]
            start, grown = n, grown - size
        size = grown
    if start < len(spans):
        yield spans[start:]


class SizedExporter(SpanExporter):
    """`exporter`, given a batch as requests of about `max_bytes` each. It counts the spans it delivered (`sent`) and
    those of requests that failed (`failed`), from the start; `take_failed` says how many failed since it was last
    called."""

    def __init__(self, exporter: SpanExporter, max_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.exporter = exporter
        self.max_bytes = max_bytes
        self.sent = self.failed = 0
        self._failed_taken = 0
        self._lock = threading.Lock()  # export runs on the batch processor's thread, the readers on the caller's

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = SpanExportResult.SUCCESS
        for chunk in chunks(spans, self.max_bytes):
            delivered = self.exporter.export(chunk) is SpanExportResult.SUCCESS
            with self._lock:
                if delivered:
                    self.sent += len(chunk)
                else:
                    self.failed += len(chunk)
            if not delivered:
                result = SpanExportResult.FAILURE
        return result

    def counts(self) -> tuple[int, int]:
        """(sent, failed), read together."""
        with self._lock:
            return self.sent, self.failed

    def take_failed(self) -> int:
        with self._lock:
            failed, self._failed_taken = self.failed - self._failed_taken, self.failed
        return failed

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)
