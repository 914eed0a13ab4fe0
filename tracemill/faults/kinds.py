"""The fault kinds, and what a corrupted output records of the faults applied to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONTENT_KINDS: tuple[str, ...] = (
    "tool_name_case", "tool_name_separator", "tool_name_prefix", "param_name", "enum_case", "number_as_string",
    "array_as_string", "extra_param", "missing_required",
    # recoverable from the conversation and the tools' meaning, never by rules (`Fault.context`)
    "omitted_value", "synonym_param", "swapped_args", "wrong_format", "wrong_tool",
)
CONTEXT_KINDS: frozenset[str] = frozenset(
    {"omitted_value", "synonym_param", "swapped_args", "wrong_format", "wrong_tool"})
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
    # a wrong tool replaces the name: a near miss of the intended one drawn before it would be mislabelled
    "tool_name_case": frozenset({"wrong_tool"}),
    "tool_name_separator": frozenset({"wrong_tool"}),
    "tool_name_prefix": frozenset({"wrong_tool"}),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault applied. Three labels: `recoverable` (rules can recover the intended call from the output alone),
    `context` (they cannot, but a reviser that reads the conversation and understands the tools can: `hint` is what
    the user's request must say for that, "" when the output and the tools suffice), or neither (lost)."""

    kind: str
    recoverable: bool
    detail: str = ""
    context: bool = False
    hint: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "recoverable": self.recoverable, "detail": self.detail, "context": self.context,
                "hint": self.hint}


@dataclass(frozen=True, slots=True)
class Corrupted:
    raw: str
    native: bool
    faults: tuple[Fault, ...] = ()

    @property
    def recoverable(self) -> bool:
        return all(f.recoverable for f in self.faults)

    @property
    def context_recoverable(self) -> bool:
        """Not recoverable by rules, but every fault is recoverable by them or from the conversation."""
        return not self.recoverable and all(f.recoverable or f.context for f in self.faults)

    @property
    def hints(self) -> tuple[str, ...]:
        """What the conversation must say for the context faults to be recoverable."""
        return tuple(f.hint for f in self.faults if f.hint)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(f.kind for f in self.faults)
