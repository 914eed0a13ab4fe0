"""The fault kinds, and what a corrupted output records of the faults applied to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONTENT_KINDS: tuple[str, ...] = (
    "tool_name_case", "tool_name_separator", "tool_name_prefix", "param_name", "enum_case", "number_as_string",
    "array_as_string", "extra_param", "missing_required",
)
RENDER_KINDS: tuple[str, ...] = (
    "pythonic", "wrapper", "python_literals", "double_encoded", "concatenated", "missing_brace", "truncated",
    "python_tag", "tool_call_tag", "fence", "prose",
)
KINDS: tuple[str, ...] = CONTENT_KINDS + RENDER_KINDS
TEXT_KINDS: frozenset[str] = frozenset(
    {"pythonic", "wrapper", "concatenated", "python_tag", "tool_call_tag", "fence", "prose"})

# A kind drawn later in KINDS order is dropped when an earlier drawn kind excludes it.
EXCLUDES: dict[str, frozenset[str]] = {
    "pythonic": frozenset({"wrapper", "python_literals", "double_encoded", "concatenated", "missing_brace"}),
    "double_encoded": frozenset({"truncated"}),
    "missing_brace": frozenset({"truncated"}),
    "python_tag": frozenset({"tool_call_tag"}),
}


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    recoverable: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "recoverable": self.recoverable, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Corrupted:
    raw: str
    native: bool
    faults: tuple[Fault, ...] = ()

    @property
    def recoverable(self) -> bool:
        return all(f.recoverable for f in self.faults)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(f.kind for f in self.faults)
