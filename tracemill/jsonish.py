"""JSON-ish model text as JSON values: JSON, Python literals (read with `ast.literal_eval`, never evaluated), missing
closing brackets, then json-repair; and the bracket scan that tells text missing its closers from text cut mid-value,
which is refused rather than completed."""

from __future__ import annotations

import ast
import json
import re
import warnings
from dataclasses import dataclass
from typing import Any

import json_repair

from tracemill.revision import Step, StepKind

NOTHING = object()  # no value: not read yet, or none to be had (None is a JSON value)
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_LITERALS = {"true", "false", "null", "True", "False", "None"}
_SPECIAL = re.compile(r"[\\\"'{}\[\]():,]")
_PAIRS = {"{": "}", "[": "]", "(": ")"}
PYTHON_ERRORS = (SyntaxError, ValueError, TypeError, MemoryError, RecursionError)


class Refused(Exception):
    """The output cannot be read without making something up (e.g. it was cut mid-value)."""


def scan(text: str, start: int) -> tuple[int, str, str]:
    """From an opening bracket at `start`: (end, state, closers). state: "closed" (balanced, ends at `end`),
    "open" (text ran out after a complete value; `closers` closes it) or "cut" (text ran out mid-value)."""
    stack: list[str] = []
    object_key: list[bool] = []
    quote = ""
    string_is_key = last_string_key = False
    skip_to = start
    for match in _SPECIAL.finditer(text, start):
        i = match.start()
        if i < skip_to:
            continue
        ch = text[i]
        if quote:
            if ch == "\\":
                skip_to = i + 2
            elif ch == quote:
                quote = ""
                last_string_key = string_is_key
        elif ch in "\"'":
            quote = ch
            string_is_key = bool(stack) and stack[-1] == "}" and object_key[-1]
        elif ch in _PAIRS:
            stack.append(_PAIRS[ch])
            object_key.append(ch == "{")
        elif ch in "}])":
            if not stack or stack[-1] != ch:
                return i, "cut", ""
            stack.pop()
            object_key.pop()
            if not stack:
                return i + 1, "closed", ""
        elif ch == ":" and stack and stack[-1] == "}":
            object_key[-1] = False
        elif ch == "," and stack and stack[-1] == "}":
            object_key[-1] = True
    n = len(text)
    tail = text[start:].rstrip()
    if quote or not tail:
        return n, "cut", ""
    last = tail[-1]
    if last in "}])":
        complete = True
    elif last in "\"'":
        complete = not last_string_key
    else:
        token = re.search(r"[\w.+\-]+$", tail)
        complete = bool(token) and (token.group() in _LITERALS or bool(NUMBER.fullmatch(token.group())))
    return n, ("open" if complete else "cut"), "".join(reversed(stack))


def _python(text: str) -> ast.Expression | None:
    """Model text parsed as a Python expression, quietly (its odd escapes are not our warnings); None when it is not
    one. Never evaluated."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(text.strip(), mode="eval")
    except PYTHON_ERRORS:
        return None


@dataclass(slots=True)
class Piece:
    """A piece of model text, each reading of it (bracket scan, Python parse, with its missing closers) done once."""

    text: str
    json_failed: bool = False  # already known not to be JSON
    _scanned: tuple[str, str] | None = None
    _tree: Any = NOTHING
    _closed_tree: Any = NOTHING

    def scan(self) -> tuple[str, str]:
        if self._scanned is None:
            _, state, closers = scan(self.text, 0)
            self._scanned = (state, closers)
        return self._scanned

    def python(self) -> ast.Expression | None:
        if self._tree is NOTHING:
            self._tree = _python(self.text)
        return self._tree

    def closed_python(self) -> ast.Expression | None:
        """The text with its missing closers added, as Python; only asked for when it scans "open"."""
        if self._closed_tree is NOTHING:
            self._closed_tree = _python(self.text + self.scan()[1])
        return self._closed_tree


def jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise ValueError(f"not a JSON value: {type(value).__name__}")


def python_literal(tree: ast.Expression | None) -> Any:
    """The JSON value of a parsed Python literal (ast.literal_eval: nothing is evaluated). Raises ValueError."""
    if tree is None:
        raise ValueError("not a Python expression")
    try:
        return jsonable(ast.literal_eval(tree))
    except PYTHON_ERRORS as exc:
        raise ValueError(str(exc)) from None


def literal(text: str) -> Any:
    """JSON, else a Python literal. Raises ValueError."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    return python_literal(_python(text))


def decode(piece: Piece, steps: list[Step]) -> Any:
    """A JSON value from JSON-ish text: JSON, Python literals, missing closing brackets, then json-repair. Raises
    Refused when the text was cut mid-value, ValueError when it is not a value."""
    text = piece.text
    if not piece.json_failed:
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            pass
    try:
        value = python_literal(piece.python())
        steps.append(Step(StepKind.PYTHON_LITERAL, "read Python literals (quotes, True/None)"))
        return value
    except ValueError:
        pass
    state, closers = piece.scan()
    if state == "cut":
        raise Refused("the output ends in the middle of a value")
    if state == "open":
        try:
            try:
                value = json.loads(text + closers)
            except (ValueError, RecursionError):
                value = python_literal(piece.closed_python())
            steps.append(Step(StepKind.CLOSE_BRACKETS, f"added the missing {closers!r}"))
            return value
        except ValueError:
            pass
    try:
        repaired = json_repair.loads(text)
    except Exception:  # json-repair is a heuristic; whatever it cannot handle is simply not repairable
        repaired = None
    if isinstance(repaired, (dict, list)) and repaired:
        steps.append(Step(StepKind.JSON_REPAIR, "repaired broken JSON with json-repair"))
        return repaired
    raise ValueError("not a JSON value")
