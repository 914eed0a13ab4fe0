"""Bounded, batched ingest. Request handlers submit decoded spans and wait; one writer thread takes everything that
is waiting, writes it in one transaction (group commit), and only then tells each request that its spans are safe.
When more spans wait than the queue allows, `submit` refuses at once so the server can answer 503."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from tracemill.collector.persist import SpanWriter
from tracemill.collector.spans import SpanRecord

log = logging.getLogger("tracemill.collector")

Done = Callable[[BaseException | None], None]


class QueueFull(Exception):
    pass


@dataclass(slots=True)
class _Job:
    spans: list[SpanRecord]
    done: Done


class Ingestor:
    def __init__(self, engine: Engine, max_queued_spans: int, max_batch_spans: int) -> None:
        self.engine = engine
        self.max_queued_spans = max_queued_spans
        self.max_batch_spans = max_batch_spans
        self._writer = SpanWriter(engine.dialect)
        self._jobs: deque[_Job] = deque()
        self._queued_spans = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="tracemill-writer", daemon=True)

    @property
    def queued_spans(self) -> int:
        return self._queued_spans

    @property
    def full(self) -> bool:
        return self._queued_spans >= self.max_queued_spans

    def start(self) -> None:
        self._thread.start()

    def submit(self, spans: list[SpanRecord], done: Done) -> None:
        """Queue spans for the next commit; `done(None)` is called once they are committed, `done(error)` if not."""
        with self._cond:
            if self._closing:
                raise QueueFull("the collector is shutting down")
            if self._queued_spans and self._queued_spans + len(spans) > self.max_queued_spans:
                raise QueueFull(f"{self._queued_spans} spans are waiting to be written")
            self._jobs.append(_Job(spans, done))
            self._queued_spans += len(spans)
            self._cond.notify()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _take(self) -> list[_Job] | None:
        with self._cond:
            while not self._jobs:
                if self._closing:
                    return None
                self._cond.wait()
            jobs, count = [], 0
            while self._jobs and (not jobs or count + len(self._jobs[0].spans) <= self.max_batch_spans):
                job = self._jobs.popleft()
                jobs.append(job)
                count += len(job.spans)
            return jobs

    def _release(self, jobs: list[_Job]) -> None:
        with self._cond:
            self._queued_spans -= sum(len(j.spans) for j in jobs)

    def _run(self) -> None:
        while (jobs := self._take()) is not None:
            try:
                self._commit([s for job in jobs for s in job.spans])
            except Exception as exc:
                # One bad request must not fail the others that shared its transaction: retry them one by one.
                log.warning("batch of %d requests failed (%s); writing them one by one", len(jobs), exc)
                for job in jobs:
                    try:
                        self._commit(job.spans)
                    except Exception as job_exc:
                        log.exception("request of %d spans not stored", len(job.spans))
                        self._finish([job], job_exc)
                    else:
                        self._finish([job], None)
            else:
                self._finish(jobs, None)

    def _finish(self, jobs: list[_Job], error: BaseException | None) -> None:
        self._release(jobs)
        for job in jobs:
            try:
                job.done(error)
            except Exception:
                log.exception("request callback failed")

    def _commit(self, spans: list[SpanRecord]) -> None:
        for attempt in range(5):
            try:
                with self.engine.begin() as conn:
                    self._writer.write(conn, spans)
            except OperationalError as exc:
                self._writer.rolled_back()
                if attempt == 4 or "locked" not in str(exc).lower():
                    raise
                time.sleep(0.2 * (attempt + 1))
            except BaseException:
                self._writer.rolled_back()
                raise
            else:
                self._writer.committed()
                return
