"""Redaction applied in the agent process, before any content leaves it."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

Redaction = Callable[[str], str] | str | re.Pattern[str] | Iterable[str | re.Pattern[str]] | None

MASK = "[REDACTED]"


class Redactor:
    """Applies a callable, or masks every match of some regexes, in every string of a value (recursively)."""

    def __init__(self, spec: Redaction = None) -> None:
        self._fn: Callable[[str], str] | None
        if spec is None:
            self._fn = None
        elif callable(spec) and not isinstance(spec, re.Pattern):
            self._fn = spec
        else:
            patterns = [spec] if isinstance(spec, (str, re.Pattern)) else list(spec)
            compiled = [re.compile(p) if isinstance(p, str) else p for p in patterns]
            self._fn = (lambda text: _mask(text, compiled)) if compiled else None

    @property
    def active(self) -> bool:
        return self._fn is not None

    def text(self, value: str) -> str:
        return self._fn(value) if self._fn is not None else value

    def value(self, value: Any) -> Any:
        if self._fn is None:
            return value
        if isinstance(value, str):
            return self._fn(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value


def _mask(text: str, patterns: list[re.Pattern[str]]) -> str:
    for pattern in patterns:
        text = pattern.sub(MASK, text)
    return text
