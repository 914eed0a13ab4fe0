"""A span processor that loses nothing: it batches ended spans and posts them as OTLP/HTTP protobuf from one worker
thread, waiting (not dropping) when the collector answers 503/429 or the queue is full, and failing loudly when the
collector rejects spans or stays unreachable."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

import httpx
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from tracemill.otlp import partial_success
from tracemill.sdk.batches import MAX_REQUEST_BYTES, chunks
from tracemill.sdk.core import traces_url


class DeliveryError(RuntimeError):
    """The collector did not take every span."""


class Delivery(SpanProcessor):
    def __init__(self, endpoint: str, api_key: str | None = None, batch_spans: int = 512,
                 max_request_bytes: int = MAX_REQUEST_BYTES, patience_s: float = 60.0) -> None:
        self.url = traces_url(endpoint)
        self.batch_spans = batch_spans
        self.max_request_bytes = max_request_bytes
        self.patience_s = patience_s
        headers = {"Content-Type": "application/x-protobuf"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(30.0, connect=5.0))
        self._batch: list[ReadableSpan] = []
        self._queue: queue.Queue[list[ReadableSpan] | None] = queue.Queue(maxsize=4)
        self._error: DeliveryError | None = None
        self.delivered = 0
        self.requests = 0
        self._worker = threading.Thread(target=self._run, name="tracemill-simulate-delivery", daemon=True)
        self._worker.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self._batch.append(span)
        if len(self._batch) >= self.batch_spans:
            self._hand_over()

    def _hand_over(self) -> None:
        if self._error is not None:
            raise self._error
        if self._batch:
            self._queue.put(self._batch)
            self._batch = []

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._send(batch)
                except DeliveryError as exc:
                    self._error = exc
                except Exception as exc:  # a bug here must surface in the caller's thread, not vanish
                    self._error = DeliveryError(f"delivery to {self.url} failed: {exc!r}")

    def _send(self, batch: Sequence[ReadableSpan]) -> None:
        for spans in chunks(batch, self.max_request_bytes):
            self._post(spans)

    def _post(self, spans: Sequence[ReadableSpan]) -> None:
        body = encode_spans(spans).SerializeToString()
        # Until the collector has taken a first batch, an unreachable or refusing endpoint is most likely a wrong URL.
        patience = self.patience_s if self.delivered else min(self.patience_s, 5.0)
        deadline = time.monotonic() + patience
        while True:
            try:
                response = self._client.post(self.url, content=body)
            except httpx.TransportError as exc:
                problem, wait = f"cannot reach the collector at {self.url}: {exc}", 1.0
            else:
                if response.status_code == 200:
                    self._check_partial(response, len(spans))
                    self.delivered += len(spans)
                    self.requests += 1
                    return
                if response.status_code not in (429, 502, 503, 504):
                    raise DeliveryError(f"the collector at {self.url} refused {len(spans)} spans: HTTP "
                                        f"{response.status_code} {response.text[:500]}")
                problem = f"the collector at {self.url} stayed busy (HTTP {response.status_code})"
                wait = _retry_after(response.headers.get("retry-after"))
            if time.monotonic() + wait > deadline:
                raise DeliveryError(f"{problem} for {patience:.0f} s; {self.delivered} spans were delivered")
            time.sleep(wait)

    @staticmethod
    def _check_partial(response: httpx.Response, sent: int) -> None:
        answer = partial_success(response.content, response.headers.get("content-type", ""))
        if answer.rejected_spans:
            raise DeliveryError(f"the collector rejected {answer.rejected_spans} of {sent} spans: "
                                f"{answer.error_message}")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def close(self) -> None:
        """Send what is left, wait for every request to be answered, and raise if anything was not delivered."""
        try:
            self._hand_over()
        finally:
            self._queue.put(None)
            self._worker.join()
            self._client.close()
        if self._error is not None:
            raise self._error

    def shutdown(self) -> None:
        if self._worker.is_alive():
            self._queue.put(None)
            self._worker.join()


def _retry_after(value: str | None) -> float:
    try:
        return min(max(float(value), 0.05), 10.0) if value else 0.5
    except ValueError:
        return 0.5
