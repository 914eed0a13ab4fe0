"""The GRPO rewards: the verifier's stages, agreement with the reference, doing no harm and grounding, one TRL reward
function per term so that each shows in the logs (`rewards/<term>/mean`).

Every term reads the calls recovered from the completion the way the served reviser reads a model's answer
(`tracemill.repair.revise`, checked by `tracemill.verify` against the row's `tools`), so the reward pays for content,
not for imitating a format; only `clean_format` looks at the text itself. A completion that copies an invalid input
unchanged earns nothing from any term. A term that does not apply to a row returns None (TRL then leaves it out).

    parses           1 when the completion holds a call that can be read, else 0
    tool_name        the share of its calls that name an offered tool
    schema           per call: 1 when valid, less 0.25 per schema violation (0 at least); the mean over calls
    reference_match  1 for BFCL-style agreement with the reference; else partial credit for the name, the parameter
                     keys and the values (0.8 at most); None without a reference
    preserve_valid   rows valid as sent: 0 when the calls come back unchanged, -1 when changed; None otherwise
    grounding        minus the share of argument values found neither in the raw output, the conversation nor the
                     schema's enums and defaults: a valid call with made-up values earns less than a faithful one
    clean_format     1 when the completion is only the call(s) as JSON
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracemill.bfcl import Answer, answers_for, ast_match, value_matches
from tracemill.repair import revise
from tracemill.reviser_prompt import message_text
from tracemill.revisers import strict_calls
from tracemill.tools import Tool, tool_index
from tracemill.verify import Stage, ToolCall, Verdict, parse_call

TERMS = ("parses", "tool_name", "schema", "reference_match", "preserve_valid", "grounding", "clean_format")
DEFAULT_WEIGHTS: dict[str, float] = {"parses": 0.5, "tool_name": 0.5, "schema": 1.0, "reference_match": 2.0,
                                     "preserve_valid": 2.0, "grounding": 1.0, "clean_format": 0.2}
PARTIAL_CAP = 0.8
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Row:
    """The columns of one RL prompt row that the rewards read, decoded."""

    raw: str
    index: Mapping[str, Tool]
    context: list[Any] | None
    reference: tuple[ToolCall, ...] | None
    valid: bool
    sent: tuple[ToolCall, ...] | None  # the calls as sent, read strictly
    source: str  # the raw output and the conversation, folded for grounding
    numbers: frozenset[float]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _fold(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


def _text(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _row(raw: str, tools: str, context: str | None, reference: str | None, valid: bool) -> Row:
    messages = _json(context)
    calls = _json(reference)
    parsed = tuple(c for c in (parse_call(item) for item in calls or ()) if isinstance(c, ToolCall))
    text = " ".join([raw, *(message_text(m)[1] for m in messages or ())])
    sent = strict_calls(raw)
    return Row(raw, tool_index(_json(tools)), messages, parsed if calls is not None else None, bool(valid),
               tuple(sent) if sent is not None else None, _fold(text),
               frozenset(float(n) for n in _NUMBER.findall(text)))


def row_from_columns(raw: str, tools: Any, context: Any = None, reference: Any = None, valid: bool = False) -> Row:
    """A Row from the columns as the miner writes them (JSON text) or as values."""
    return _row(raw, _text(tools), _text(context), _text(reference), bool(valid))


@dataclass(frozen=True, slots=True)
class Scores:
    parses: float
    tool_name: float
    schema: float
    reference_match: float | None
    preserve_valid: float | None
    grounding: float
    clean_format: float
    copied_invalid: bool = False

    def term(self, name: str) -> float | None:
        return getattr(self, name)


def completion_text(completion: Any) -> str | Mapping[str, Any]:
    """A completion as TRL passes it: text, or a conversational `[{"role": "assistant", "content": ...}]` (a message
    with parsed `tool_calls` is returned whole, for the reader)."""
    if isinstance(completion, str):
        return completion
    message = completion[-1] if isinstance(completion, Sequence) and completion else completion
    if isinstance(message, Mapping):
        return message if message.get("tool_calls") else str(message.get("content") or "")
    return str(message)


def _schema_credit(verdict: Verdict) -> float:
    if verdict.ok:
        return 1.0
    if not verdict.name_valid or verdict.stage is Stage.PARSE:
        return 0.0
    return max(0.0, 1.0 - 0.25 * sum(v.stage is Stage.SCHEMA for v in verdict.violations))


def _call_credit(call: ToolCall, answer: Answer) -> float:
    (name, params), = answer.items()
    if call.name != name:
        return 0.0
    keys = set(call.arguments) | {p for p, accepted in params.items() if "" not in accepted}
    shared = set(call.arguments) & set(params)
    key_share = len(shared) / len(keys) if keys else 1.0
    values = sum(value_matches(call.arguments[p], params[p]) for p in shared)
    value_share = values / len(keys) if keys else 1.0
    return 0.25 + 0.25 * key_share + 0.5 * value_share


def reference_credit(calls: Sequence[ToolCall], answers: Sequence[Answer], index: Mapping[str, Tool]) -> float:
    """1 for BFCL's AST agreement; else the best credit each expected call gets from a different call, averaged over
    the larger of the two counts (so a missing or an extra call costs), capped at PARTIAL_CAP."""
    if not answers:
        return 1.0 if not calls else 0.0
    if ast_match(calls, answers, index):
        return 1.0
    left = list(calls)
    total = 0.0
    for answer in answers:
        credits = [_call_credit(c, answer) for c in left]
        if credits:
            best = max(range(len(left)), key=lambda i: credits[i])
            total += credits[best]
            left.pop(best)
    return min(PARTIAL_CAP, total / max(len(calls), len(answers)))


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, bool) or value is None or value == "":
        return []
    return [value]


def _schema_values(tool: Tool | None) -> set[str]:
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for key in ("enum", "default", "const", "examples"):
                for v in node.get(key) if isinstance(node.get(key), list) else [node.get(key)]:
                    if isinstance(v, (str, int, float)) and not isinstance(v, bool):
                        found.add(_fold(str(v)))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(tool.input_schema if tool is not None else None)
    return found


def grounded(value: Any, row: Row, tool: Tool | None) -> bool:
    """Whether an argument value is found in the raw output, the conversation or the tool's schema (enum, default)."""
    if isinstance(value, (int, float)):
        return float(value) in row.numbers or _fold(str(value)) in _schema_values(tool)
    text = _fold(str(value))
    return text in row.source or text in _schema_values(tool)


def _squash(text: str) -> str:
    return _SPACE.sub("", text)


def score(completion: Any, row: Row) -> Scores:
    """Every term for one completion of one row."""
    answer = completion_text(completion)
    if not row.valid and isinstance(answer, str) and _squash(answer) == _squash(row.raw):
        return Scores(0.0, 0.0, 0.0, 0.0 if row.reference is not None else None, None, 0.0, 0.0, copied_invalid=True)
    revision = revise(answer, row.index, row.context)
    calls = revision.calls
    verdicts = revision.verdicts if calls else ()
    parses = 1.0 if calls else 0.0
    tool_name = sum(v.name_valid for v in verdicts) / len(verdicts) if verdicts else 0.0
    schema = sum(_schema_credit(v) for v in verdicts) / len(verdicts) if verdicts else 0.0
    reference = reference_credit(calls, answers_for(row.reference), row.index) if row.reference is not None else None
    preserve = None
    if row.valid:
        preserve = 0.0 if row.sent is not None and list(calls) == list(row.sent) else -1.0
    leaves = [(leaf, row.index.get(c.name)) for c in calls for leaf in _leaves(c.arguments)]
    grounding = -sum(not grounded(v, row, t) for v, t in leaves) / len(leaves) if leaves else 0.0
    clean = 1.0 if isinstance(answer, str) and strict_calls(answer.strip()) is not None else 0.0
    return Scores(parses, tool_name, schema, reference, preserve, grounding, clean)


class Scorer:
    """Scores each (row, completion) of a batch once, however many reward functions ask: TRL calls each term in turn
    on the same batch, so the latest batch's scores are kept, and no more (its columns may hold whole agent contexts,
    hundreds of KB each). A row is decoded once per batch, however many completions of its group the batch holds."""

    def __init__(self) -> None:
        self._last: dict[tuple[Any, ...], Scores] = {}

    def batch(self, completions: Sequence[Any], raw: Sequence[str], tools: Sequence[Any],
              context: Sequence[Any] | None = None, reference: Sequence[Any] | None = None,
              valid: Sequence[bool] | None = None) -> list[Scores]:
        scored: dict[tuple[Any, ...], Scores] = {}
        rows: dict[tuple[Any, ...], Row] = {}
        keys = []
        for i, completion in enumerate(completions):
            columns = (raw[i], _text(tools[i]), _text(context[i]) if context else None,
                       _text(reference[i]) if reference else None, bool(valid[i]) if valid else False)
            key = (*columns, _text(completion_text(completion)))
            keys.append(key)
            if key in scored:
                continue
            found = self._last.get(key)
            if found is None:
                row = rows.get(columns)
                if row is None:
                    row = rows[columns] = _row(*columns)
                found = score(completion, row)
            scored[key] = found
        self._last = scored
        return [scored[key] for key in keys]


_SCORER = Scorer()


def _term(name: str) -> Callable[..., list[float | None]]:
    def reward(completions: Sequence[Any], raw: Sequence[str], tools: Sequence[Any],
               context: Sequence[Any] | None = None, reference: Sequence[Any] | None = None,
               valid: Sequence[bool] | None = None, log_metric: Callable[[str, float], None] | None = None,
               **_: Any) -> list[float | None]:
        scores = _SCORER.batch(completions, raw, tools, context, reference, valid)
        if log_metric is not None and name == TERMS[0]:
            invalid = [s for s, v in zip(scores, valid or [False] * len(scores), strict=True) if not v]
            if invalid:
                log_metric("copied_invalid", sum(s.copied_invalid for s in invalid) / len(invalid))
            changed = [s.preserve_valid for s in scores if s.preserve_valid is not None]
            if changed:
                log_metric("valid_changed", sum(p < 0 for p in changed) / len(changed))
        return [s.term(name) for s in scores]

    reward.__name__ = reward.__qualname__ = name
    return reward


REWARD_FUNCTIONS: dict[str, Callable[..., list[float | None]]] = {name: _term(name) for name in TERMS}
