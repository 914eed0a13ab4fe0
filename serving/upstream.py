"""The model server behind the proxy: where a path goes, which headers travel, and what a failure looks like to the
client (an OpenAI-style error body with the status that says whose fault it was).

The client is aiohttp's: httpx's connection pool walks (and polls) every pooled connection on each request, which
capped the sidecar at 429 requests/s on this machine's two cores, short of 500; with aiohttp it peaks at 2,730
(bench/README.md, "Serving")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import orjson
from multidict import CIMultiDict
from starlette.requests import Request
from starlette.responses import Response

T = TypeVar("T")

# Hop-by-hop headers (RFC 9110 7.6.1), and those the proxy sets itself.
_NOT_FORWARDED = frozenset({"host", "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
                            "trailer", "upgrade", "content-length"})
_NOT_RETURNED = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                           "content-length", "date", "server"})
UpstreamError = (aiohttp.ClientError, asyncio.TimeoutError)


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: CIMultiDict[str]  # as they go back to the client, a header sent more than once (Set-Cookie) kept so
    body: bytes


class Upstream:
    def __init__(self, base_url: str, timeout: float) -> None:
        base = base_url.rstrip("/")
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--upstream {base_url!r} is not an http(s) URL such as http://127.0.0.1:8001/v1")
        self.base = base
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """Made on first use, inside the event loop that serves."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=30),
                timeout=aiohttp.ClientTimeout(total=None, connect=min(10.0, self.timeout), sock_read=self.timeout),
                auto_decompress=False, skip_auto_headers=("User-Agent",))
        return self._session

    def url(self, path: str) -> str:
        """`/v1/...` goes under the upstream's OpenAI base URL, anything else under its origin."""
        return f"{self.base}{path[3:]}" if path == "/v1" or path.startswith("/v1/") else f"{self.origin}{path}"

    @staticmethod
    def headers(request: Request, identity: bool) -> CIMultiDict[str]:
        """The client's headers for the upstream; `identity`: ask for an unencoded body (one the proxy reads). A client
        that names no encoding gets none (the HTTP client would otherwise ask for gzip, and pass it on undecoded)."""
        found = CIMultiDict((k, v) for k, v in request.headers.items() if k not in _NOT_FORWARDED)
        if identity or "accept-encoding" not in found:
            found["accept-encoding"] = "identity"
        return found

    @staticmethod
    def returned(response: aiohttp.ClientResponse) -> CIMultiDict[str]:
        """The upstream's response headers, for the client, each as often as it was sent."""
        return CIMultiDict((k, v) for k, v in response.headers.items() if k.lower() not in _NOT_RETURNED)

    def error(self, exc: BaseException) -> Response:
        if isinstance(exc, asyncio.TimeoutError):
            kind = "connecting" if isinstance(exc, aiohttp.ConnectionTimeoutError) else "waiting for it"
            return error_response(504, f"the upstream at {self.base} did not answer in time ({kind}, limit "
                                  f"{self.timeout:g} s)", "upstream_timeout")
        return error_response(502, f"the upstream at {self.base} could not be reached: {type(exc).__name__}: "
                              f"{exc or 'connection failed'}", "upstream_unreachable")

    async def fetch(self, method: str, path: str, request: Request, body: bytes | None,
                    identity: bool = True) -> Answer:
        """One whole answer."""
        async with self.session.request(method, self.url(path), data=body, params=_query(request),
                                        headers=self.headers(request, identity)) as response:
            return Answer(response.status, self.returned(response), await response.read())

    async def open(self, method: str, path: str, request: Request, body: bytes | None,
                   identity: bool = True) -> aiohttp.ClientResponse:
        """An answer to read as it comes; `close(response)` when done with it."""
        return await self.session.request(method, self.url(path), data=body, params=_query(request),
                                          headers=self.headers(request, identity))

    @staticmethod
    async def chunks(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        async for data in response.content.iter_any():
            yield data

    @staticmethod
    def close(response: aiohttp.ClientResponse, finished: bool) -> None:
        """Give the connection back when the answer was read to its end; else close it, which tells the upstream to
        stop (vLLM aborts a request whose client went away)."""
        if finished:
            response.release()
        else:
            response.close()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _query(request: Request) -> list[tuple[str, str]]:
    return request.query_params.multi_items()


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
