"""Request bodies read within the collector's limits: a size (413), a byte budget shared by all the bodies being read
(503) and a deadline (408).

The budget counts what has arrived of each body, not what it announces: a sender trickling its body, chunked or
behind a large Content-Length, holds only the bytes it sent, and only until the deadline, so one slow client cannot
starve the others. A Content-Length that does not fit in what is left is refused before anything is read; a body
whose bytes overrun the budget while others are being read is refused when they do."""

from __future__ import annotations

import asyncio

from starlette.requests import Request

from tracemill.collector.worker import BodyTooLarge


class Busy(Exception):
    """The budget is spent: retry later."""


class TooSlow(Exception):
    """The body did not arrive in time."""


class InFlight:
    """Bytes of the request bodies being read now. One body alone may go over the budget (up to the body limit)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0

    def admits(self, declared: int) -> bool:
        return not self.used or self.used + declared <= self.budget

    def take(self, held: int, size: int) -> bool:
        """Counts `size` more bytes of a body that holds `held`, unless that goes over the budget while other bodies
        hold some of it."""
        if self.used > held and self.used + size > self.budget:
            return False
        self.used += size
        return True

    def give_back(self, size: int) -> None:
        self.used -= size


async def read_body(request: Request, limit: int, inflight: InFlight, timeout_s: float) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit():
        if int(declared) > limit:
            raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit}")
        if not inflight.admits(int(declared)):
            raise Busy(f"{inflight.used} bytes of requests are being read")
    chunks: list[bytes] = []
    held = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                if held + len(chunk) > limit:
                    raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
                if not inflight.take(held, len(chunk)):
                    raise Busy(f"{inflight.used} bytes of requests are being read")
                held += len(chunk)
                chunks.append(chunk)
    except TimeoutError:
        raise TooSlow(f"the request body did not arrive within {timeout_s:g} s ({held} bytes did): send it faster, "
                      "or in smaller requests") from None
    finally:
        inflight.give_back(held)
    return b"".join(chunks)
