"""Memoising functions of text that may be huge. Agent contexts reach hundreds of KB each: an LRU cache of a few
thousand of them, with what is computed from them, holds gigabytes. `cache_short` caches only calls whose text is
short, the ones that repeat (a prompt's tool line, a conversation's request); a longer call is computed each time."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, wraps
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def cache_short(limit: int, maxsize: int) -> Callable[[F], F]:
    """`functools.lru_cache(maxsize)` for the calls whose string arguments (positional) come to `limit` characters at
    most, so that the cache holds about `maxsize` x `limit` characters of keys at most."""

    def decorate(function: F) -> F:
        cached = lru_cache(maxsize=maxsize)(function)

        @wraps(function)
        def call(*args: Any) -> Any:
            if len(args) == 1 and type(args[0]) is str:  # the usual call, without the sum's generator
                size = len(args[0])
            else:
                size = sum(len(a) for a in args if isinstance(a, str))
            if size <= limit:
                return cached(*args)
            return function(*args)

        call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        call.cache_info = cached.cache_info  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return decorate
