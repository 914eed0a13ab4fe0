"""Bounded ingest through a pool of ingest processes (`collector.worker`).

A request first reserves room (`reserve`), before its body is read, so that a collector under overload answers 503
at once instead of reading bodies it will not keep. Its body then goes to whichever ingest process is free, which
decodes, verifies and commits it; the request is answered only after that commit. Requests hold their reservation
until then: the spans being read, waiting for a process or being written stay within `max_queued_spans`."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from tracemill.collector import worker
from tracemill.collector.worker import NotStored, Stored, WorkerConfig
from tracemill.store.sqlite_writer import Checkpointer, database_path

log = logging.getLogger("tracemill.collector")


class QueueFull(Exception):
    pass


@dataclass(slots=True)
class Reservation:
    spans: int  # the room held for the request: an estimate, as its spans are only counted once decoded
    open: bool = True


class Ingestor:
    def __init__(self, config: WorkerConfig, processes: int, max_queued_spans: int) -> None:
        self.config = config
        self.processes = processes
        self.max_queued_spans = max_queued_spans
        self._held_spans = 0
        self._typical_request = 512.0  # spans per request, averaged: what a reservation holds (the SDK's batch)
        self._lock = threading.Lock()
        self._closing = False
        self._pool: ProcessPoolExecutor | None = None
        # One checkpointer for the ingest processes' SQLite store (they open it with automatic checkpoints off).
        database = database_path(config.database_url)
        self._checkpointer = Checkpointer(database) if database is not None else None

    @property
    def queued_spans(self) -> int:
        return self._held_spans

    async def start(self) -> None:
        """Start every ingest process now, not on the first requests."""
        self._pool = self._new_pool()
        if self._checkpointer is not None:
            self._checkpointer.start()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._pool, worker.ready) for _ in range(self.processes)))

    def close(self) -> None:
        """Finish what was handed to the ingest processes, then stop them."""
        self._closing = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._checkpointer is not None:
            self._checkpointer.stop()

    def reserve(self) -> Reservation:
        """Room for one request's spans, or QueueFull. Give it back with `release` once the request is answered."""
        with self._lock:
            if self._closing:
                raise QueueFull("the collector is shutting down")
            estimate = max(1, min(round(self._typical_request), self.max_queued_spans))
            if self._held_spans and self._held_spans + estimate > self.max_queued_spans:
                raise QueueFull(f"{self._held_spans} spans are waiting to be written")
            self._held_spans += estimate
            return Reservation(estimate)

    def release(self, reservation: Reservation) -> None:
        with self._lock:
            if reservation.open:
                reservation.open = False
                self._held_spans -= reservation.spans

    async def ingest(self, body: bytes, content_type: str, gzipped: bool, logs: bool = False) -> Stored:
        """Decode, verify and commit a body (spans, or with `logs` log records) in an ingest process. Raises what
        `worker.ingest` raises, and NotStored when an ingest process died (the pool is started afresh for the next
        requests)."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("Ingestor.start was not awaited")
        try:
            stored = await asyncio.get_running_loop().run_in_executor(pool, worker.ingest, body, content_type, gzipped,
                                                                  logs)
        except BrokenProcessPool as exc:
            self._replace(pool)
            raise NotStored(f"an ingest process stopped ({exc})") from None
        with self._lock:
            self._typical_request += (stored.spans - self._typical_request) / 8
        return stored

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is not broken or self._closing:
                return
            log.error("an ingest process stopped; starting them afresh")
            self._pool = self._new_pool()
            for _ in range(self.processes):
                self._pool.submit(worker.ready)
        broken.shutdown(wait=False, cancel_futures=True)

    def _new_pool(self) -> ProcessPoolExecutor:
        # spawn, not fork: the HTTP process has threads (the event loop's executor), which a fork would copy mid-state.
        return ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=worker.start, initargs=(self.config,))
