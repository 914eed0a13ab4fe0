"""The model server behind the proxy: where a path goes, which headers travel, and what a failure looks like to the
client (an OpenAI-style error body with the status that says whose fault it was)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response

T = TypeVar("T")

# Hop-by-hop headers (RFC 9110 7.6.1), and those the proxy sets itself.
_NOT_FORWARDED = frozenset({"host", "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
                            "trailer", "upgrade", "content-length"})
_NOT_RETURNED = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                           "content-length", "date", "server"})


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


class Upstream:
    def __init__(self, base_url: str, timeout: float) -> None:
        base = base_url.rstrip("/")
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--upstream {base_url!r} is not an http(s) URL such as http://127.0.0.1:8001/v1")
        self.base = base
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.timeout = timeout
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(10.0, timeout), pool=min(10.0, timeout)),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200), trust_env=False)

    def url(self, path: str) -> str:
        """`/v1/...` goes under the upstream's OpenAI base URL, anything else under its origin."""
        return f"{self.base}{path[3:]}" if path == "/v1" or path.startswith("/v1/") else f"{self.origin}{path}"

    @staticmethod
    def headers(request: Request, identity: bool) -> dict[str, str]:
        """The client's headers for the upstream; `identity`: ask for an unencoded body (one the proxy reads)."""
        found = {k: v for k, v in request.headers.items() if k not in _NOT_FORWARDED}
        if identity:
            found["accept-encoding"] = "identity"
        return found

    @staticmethod
    def returned(headers: httpx.Headers, decoded: bool) -> dict[str, str]:
        """The upstream's response headers for the client; `decoded`: the body was read, so it is not encoded."""
        return {k: v for k, v in headers.items()
                if k not in _NOT_RETURNED and not (decoded and k == "content-encoding")}

    def error(self, exc: httpx.HTTPError) -> Response:
        if isinstance(exc, httpx.TimeoutException):
            kind = "connecting" if isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout)) else "waiting for it"
            return error_response(504, f"the upstream at {self.base} did not answer in time ({kind}, limit "
                                  f"{self.timeout:g} s)", "upstream_timeout")
        return error_response(502, f"the upstream at {self.base} could not be reached: {type(exc).__name__}: "
                              f"{exc or 'connection failed'}", "upstream_unreachable")

    async def fetch(self, request: httpx.Request) -> httpx.Response:
        """Send and read a whole answer, closing the connection's use however it ends."""
        response = await self.client.send(request, stream=True)
        try:
            await response.aread()
        finally:
            await asyncio.shield(response.aclose())
        return response

    async def close(self) -> None:
        await self.client.aclose()


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status}}


def error_response(status: int, message: str, kind: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(orjson.dumps(error_body(status, message, kind)), status, headers=dict(headers or {}),
                    media_type="application/json")


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled when the client disconnects first (then ClientGone)."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        if not watch.done():
            watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    raise ClientGone
