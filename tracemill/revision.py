"""What a reviser returns: the calls, whether they are valid, and every step it took (typed, for people and the miner).

Shared by the deterministic reviser (`tracemill.repair`), its reader (`tracemill.reader`) and every other reviser
behind `tracemill.revisers`."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from tracemill.verify import ToolCall, Verdict


class StepKind(str, enum.Enum):
    EXTRACT = "extract"                # the call was found inside text (prose, fences, tags)
    PYTHONIC = "pythonic"              # read from a Python-style call
    XML_PARAMETERS = "xml_parameters"  # read from XML parameters (Qwen3-Coder), typed by the schema
    PLAIN_INPUT = "plain_input"        # a one-parameter tool's input given as plain text (ReAct)
    PYTHON_LITERAL = "python_literal"  # single quotes, True/None
    CLOSE_BRACKETS = "close_brackets"  # missing closing brackets added
    JSON_REPAIR = "json_repair"        # other broken JSON, repaired by json-repair
    UNWRAP = "unwrap"                  # a wrapper shape read as {"name", "arguments"}
    SPLIT = "split"                    # several calls in one output
    DECODE_ARGUMENTS = "decode_arguments"  # arguments encoded as a string once too often
    TOOL_NAME = "tool_name"
    PARAM_NAME = "param_name"
    COERCE = "coerce"
    ENUM_CASE = "enum_case"
    DROP_UNKNOWN = "drop_unknown"
    DROP_NULL = "drop_null"            # an optional parameter sent as null where the schema does not take null
    DEFAULT = "default"
    MODEL = "model"                    # a model reviser rewrote the call


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    reason: str
    call: int | None = None
    pointer: str = ""
    before: Any = None
    after: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "reason": self.reason, "call": self.call, "pointer": self.pointer,
                "before": self.before, "after": self.after}


@dataclass(frozen=True, slots=True)
class Revision:
    """`verdicts` has one Verdict per call; when no call could be read it holds the one parse failure."""

    calls: tuple[ToolCall, ...]
    ok: bool
    changed: bool
    steps: tuple[Step, ...] = ()
    verdicts: tuple[Verdict, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "changed": self.changed, "calls": [c.to_dict() for c in self.calls],
                "steps": [s.to_dict() for s in self.steps], "verdicts": [v.to_dict() for v in self.verdicts]}
