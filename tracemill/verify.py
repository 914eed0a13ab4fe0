"""The MCP tool-call verifier: MCP-Bench's rule-based checks, as data.

Stages, in order: parse (the call is JSON with a name and an arguments object) → tool name (among the tools offered)
→ input schema (jsonschema, with the schema's own draft) → execution (when the outcome is known). The first stage that
fails is the Verdict's `stage`; every violation of that stage is listed with its JSON pointer into the call.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import fastjsonschema
import orjson
from jsonschema import Draft202012Validator, SchemaError
from jsonschema.exceptions import ValidationError
from jsonschema.validators import validator_for

from tracemill.tools import Tool, tool_index


class Stage(str, enum.Enum):
    PARSE = "parse"
    TOOL_NAME = "tool_name"
    SCHEMA = "schema"
    EXECUTION = "execution"


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True, slots=True)
class Violation:
    stage: Stage
    kind: str
    pointer: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"stage": self.stage.value, "kind": self.kind, "pointer": self.pointer, "message": self.message}


@dataclass(frozen=True, slots=True)
class Execution:
    """What happened when the call ran: `ok`, and the error or result text."""

    ok: bool
    error: str | None = None
    result: str | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    stage: Stage | None
    violations: tuple[Violation, ...] = ()
    call: ToolCall | None = None
    tool: Tool | None = None
    execution: Execution | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def parsed(self) -> bool:
        return self.call is not None

    @property
    def name_valid(self) -> bool:
        return self.tool is not None

    @property
    def schema_valid(self) -> bool | None:
        """None when the tool is not known; False also when the arguments could not be read."""
        if self.tool is None:
            return None
        return self.stage not in (Stage.SCHEMA, Stage.PARSE)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "stage": self.stage.value if self.stage else None,
            "violations": [v.to_dict() for v in self.violations],
            "call": self.call.to_dict() if self.call else None,
            "warnings": list(self.warnings),
        }


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*parts: str | int) -> str:
    return "".join("/" + _escape(str(p)) for p in parts)


def parse_failure(kind: str, where: str, message: str) -> Verdict:
    """The Verdict of output that could not be read as a call: one parse violation."""
    return Verdict(ok=False, stage=Stage.PARSE, violations=(Violation(Stage.PARSE, kind, where, message),))


def parse_call(raw: str | bytes | Mapping[str, Any] | ToolCall) -> ToolCall | Verdict:
    """The call as the model emitted it, read strictly: no repair. A failed Verdict when it is not one call.

    Accepts a ToolCall, `{"name", "arguments"}` (arguments an object, or a JSON string of one as the OpenAI API sends),
    `{"type": "function", "function": {...}}`, or the JSON text of either."""
    if isinstance(raw, ToolCall):  # made by the caller (a reviser, an SDK), whose numbers may be NaN
        return _finite(raw)
    if isinstance(raw, (str, bytes)):
        try:
            raw = strict_json(raw)
        except (ValueError, RecursionError) as exc:
            return parse_failure("invalid_json", "", f"not valid JSON: {exc}")
    if isinstance(raw, list):
        return parse_failure("not_a_single_call", "", f"expected one call object, got a list of {len(raw)}")
    if not isinstance(raw, Mapping):
        return parse_failure("not_a_call", "", f"expected a call object, got {type(raw).__name__}")
    body: Mapping[str, Any] = raw
    base: tuple[str, ...] = ()
    if "function" in raw and isinstance(raw["function"], Mapping) and "name" not in raw:
        body, base = raw["function"], ("function",)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        return parse_failure("missing_name", pointer(*base, "name"), "the call has no tool name string")
    if "arguments" not in body:
        return parse_failure("missing_arguments", pointer(*base, "arguments"), "the call has no 'arguments'")
    arguments = body["arguments"]
    if isinstance(arguments, str):
        try:
            arguments = strict_json(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as exc:
            return parse_failure("invalid_json", pointer(*base, "arguments"), f"arguments are not valid JSON: {exc}")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return parse_failure(
            "arguments_not_object", pointer(*base, "arguments"),
            f"arguments must be an object, got {type(arguments).__name__}",
        )
    return ToolCall(name=name, arguments=arguments)


def _finite(call: ToolCall) -> ToolCall | Verdict:
    """The call, or a parse failure where its arguments hold a number JSON cannot carry (NaN, an infinity)."""
    try:
        if b"null" not in orjson.dumps(call.arguments):  # orjson writes NaN and infinities as null: none here
            return call
    except TypeError:  # a value or key JSON has no type for: walked like the rest
        pass
    where = _non_finite(call.arguments)
    if where is None:
        return call
    return parse_failure("invalid_json", pointer("arguments", *reversed(where)),
                         "NaN and infinities are not JSON values")


def _non_finite(value: Any) -> list[str] | None:
    """The path to a NaN or infinity in `value`, innermost key first; None where there is none."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(item, float):
            if item - item != 0.0:  # NaN for NaN and the infinities, 0.0 for every other float
                return [str(key)]
        elif isinstance(item, (dict, list)):
            found = _non_finite(item)
            if found is not None:
                found.append(str(key))
                return found
    return None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_number(text: str) -> float:
    number = float(text)
    if number - number != 0.0:  # 1e999: JSON's grammar, no double's range (read as infinity, written back as null)
        raise ValueError(f"{text} is out of a number's range")
    return number


# made once: `json.loads` with an option makes one each call
_STRICT = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite_number)


def strict_json(text: str | bytes) -> Any:
    """JSON as RFC 8259 has it: Python's reader takes NaN and Infinity, a strict MCP server does not; a number past a
    double's range (1e999) is refused too, not read as infinity."""
    if isinstance(text, bytes):
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    return _STRICT.decode(text)


_KINDS = {
    "required": "missing_required",
    "type": "wrong_type",
    "additionalProperties": "unknown_param",
    "unevaluatedProperties": "unknown_param",
    "enum": "enum",
    "const": "const",
    "minimum": "out_of_range",
    "maximum": "out_of_range",
    "exclusiveMinimum": "out_of_range",
    "exclusiveMaximum": "out_of_range",
    "multipleOf": "out_of_range",
    "minLength": "string_length",
    "maxLength": "string_length",
    "pattern": "pattern",
    "format": "format",
    "minItems": "array_length",
    "maxItems": "array_length",
    "uniqueItems": "unique_items",
    "anyOf": "no_match",
    "oneOf": "no_match",
    "allOf": "no_match",
    "not": "no_match",
    "dependentRequired": "missing_required",
    "minProperties": "object_size",
    "maxProperties": "object_size",
}


# Keywords whose meaning differs between drafts, or that reach outside the schema (`$ref`), or whose checks differ
# between libraries (`format`): a schema using any of them is always checked by jsonschema alone.
_NOT_FOR_FAST_PATH = frozenset({
    "$ref", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor", "$anchor", "$id", "$defs",
    "definitions", "prefixItems", "additionalItems", "unevaluatedProperties", "unevaluatedItems", "dependencies",
    "dependentRequired", "dependentSchemas", "minContains", "maxContains", "format", "contentEncoding",
    "contentMediaType", "contentSchema",
})


def _uses_any(schema: Any, keywords: frozenset[str]) -> bool:
    if isinstance(schema, dict):
        return any(k in keywords or _uses_any(v, keywords) for k, v in schema.items())
    if isinstance(schema, list):
        return any(_uses_any(v, keywords) for v in schema)
    return False


@dataclass(slots=True)
class _Compiled:
    validator: Any
    warning: str | None
    schema: Any = None
    # fastjsonschema's code for the same schema, where it means the same: when it accepts the arguments, so does
    # jsonschema, twenty times slower. Any refusal is explained by jsonschema. Generating that code costs more than
    # a few checks, so it is made once a schema has been used `_FAST_AFTER` times.
    eligible: bool = False
    uses: int = 0
    fast: Any = None

    def fast_check(self) -> Any:
        if self.fast is None and self.eligible:
            try:
                self.fast = fastjsonschema.compile(self.schema, use_default=False, detailed_exceptions=False)
            except Exception:  # a schema fastjsonschema cannot compile: jsonschema checks it, as before
                self.eligible = False
        return self.fast

    def accepts_quickly(self, arguments: dict[str, Any]) -> bool:
        if not self.eligible:
            return False
        if self.fast is None:
            self.uses += 1
            if self.uses < _FAST_AFTER or self.fast_check() is None:
                return False
        try:
            self.fast(arguments)
        except Exception:  # any refusal: the full check decides, and says why
            return False
        return True


_FAST_AFTER = 3


@lru_cache(maxsize=8192)
def _compile(schema_json: bytes) -> _Compiled:
    schema = orjson.loads(schema_json)
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        return _Compiled(None, f"the tool's input schema is not valid JSON Schema ({exc.message}); not checked")
    return _Compiled(cls(schema, format_checker=cls.FORMAT_CHECKER), None, schema,
                     eligible=not _uses_any(schema, _NOT_FOR_FAST_PATH))


_BY_IDENTITY: dict[int, tuple[Mapping[str, Any], _Compiled]] = {}  # a schema object seen before: not dumped again


def compiled_validator(schema: Mapping[str, Any]) -> _Compiled:
    """One validator per distinct schema, compiled once (a tool index's schemas, checked call after call, are found
    by identity; the entry holds its schema, so that its id is not reused while it is kept)."""
    found = _BY_IDENTITY.get(id(schema))
    if found is not None and found[0] is schema:
        return found[1]
    compiled = _compile(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    if len(_BY_IDENTITY) >= 8192:
        _BY_IDENTITY.clear()
    _BY_IDENTITY[id(schema)] = (schema, compiled)
    return compiled


def _violations(error: ValidationError) -> list[Violation]:
    path = ("arguments", *error.absolute_path)
    kind = _KINDS.get(str(error.validator), str(error.validator))
    if error.validator == "required":
        missing = [r for r in error.validator_value if isinstance(error.instance, Mapping) and r not in error.instance]
        return [Violation(Stage.SCHEMA, kind, pointer(*path, m), f"missing required parameter {m!r}") for m in missing]
    if error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(error.instance, Mapping):
        allowed = set(error.schema.get("properties", {}))
        extras = [k for k in error.instance if k not in allowed] or [""]
        return [Violation(Stage.SCHEMA, kind, pointer(*path, k), f"unknown parameter {k!r}") for k in extras]
    return [Violation(Stage.SCHEMA, kind, pointer(*path), error.message)]


def verify(
    raw_or_call: str | bytes | Mapping[str, Any] | ToolCall,
    tools: Sequence[Any] | Mapping[str, Tool] | None,
    execution: Execution | None = None,
    *,
    name: str | None = None,
) -> Verdict:
    """Check one tool call against the tools the model was offered. `tools` may be any accepted tool shapes, or a
    ready `tool_index` for callers that verify many calls against one list; None when it is not known which tools
    were offered: then nothing is judged past parsing (ok False, stage None unless the call does not parse).

    `name`: the tool name of a native (structured) call, which names its tool apart from its arguments. When its
    arguments cannot be read the name is still judged: the verdict fails at parse, its `tool` is the named tool when
    that was offered, and the arguments do not comply with the schema."""
    parsed = parse_call(raw_or_call)
    if tools is None:
        return parsed if isinstance(parsed, Verdict) else Verdict(ok=False, stage=None, call=parsed)
    index = tools if isinstance(tools, Mapping) else tool_index(tools)
    if isinstance(parsed, Verdict):
        return replace(parsed, tool=index[name]) if name is not None and name in index else parsed
    tool = index.get(parsed.name)
    if tool is None:
        return Verdict(
            ok=False, stage=Stage.TOOL_NAME, call=parsed,
            violations=(Violation(Stage.TOOL_NAME, "unknown_tool", "/name",
                                  f"{parsed.name!r} is not among the {len(index)} tools offered"),),
        )
    compiled = compiled_validator(tool.input_schema)
    warnings = (compiled.warning,) if compiled.warning else ()
    if compiled.validator is not None and not compiled.accepts_quickly(parsed.arguments):
        errors = sorted(compiled.validator.iter_errors(parsed.arguments), key=lambda e: list(e.absolute_path))
        if errors:
            found = tuple(dict.fromkeys(v for e in errors for v in _violations(e)))
            return Verdict(ok=False, stage=Stage.SCHEMA, violations=found, call=parsed, tool=tool,
                           warnings=warnings)
    if execution is not None and not execution.ok:
        return Verdict(
            ok=False, stage=Stage.EXECUTION, call=parsed, tool=tool, execution=execution, warnings=warnings,
            violations=(Violation(Stage.EXECUTION, "execution_error", "", execution.error or "the tool call failed"),),
        )
    return Verdict(ok=True, stage=None, call=parsed, tool=tool, execution=execution, warnings=warnings)
