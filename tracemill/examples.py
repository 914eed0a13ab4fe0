"""Values that fit a tool's input schema, for calls that come without data: `example_value` and `example_call` give one
deterministic value (the eval suites' example calls, benchmarks), `sampled_value` and `sampled_arguments` draw
plausible ones from a seeded generator and the user's request (the simulator's agents)."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from tracemill.tools import Tool, schema_types
from tracemill.verify import ToolCall, verify


def example_value(schema: Any, name: str) -> Any:
    """A plausible value that fits a property schema (for test calls over schemas that come without calls)."""
    if not isinstance(schema, Mapping):
        return None
    for key in ("default", "const"):
        if key in schema and schema[key] is not None:
            return schema[key]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][len(schema["enum"]) // 2]
    if isinstance(schema.get("examples"), list) and schema["examples"]:
        return schema["examples"][0]
    types = schema_types(schema) - {"null"}
    kind = min(types) if types else "string"
    if kind == "integer":
        low = schema.get("minimum", 1)
        return int(max(low, min(schema.get("maximum", 12), 12)))
    if kind == "number":
        return float(max(schema.get("minimum", 0.5), min(schema.get("maximum", 2.5), 2.5)))
    if kind == "boolean":
        return True
    if kind == "array":
        item = example_value(schema.get("items"), name)
        return [item] if item is not None else []
    if kind == "object":
        return {}
    words = re.findall(r"[a-z]+", _split_words(name))
    return " ".join(words) or "example"


def _split_words(name: str) -> str:
    return re.sub(r"(?<=[a-z])([A-Z])", r" \1", name).replace("_", " ").lower()


def example_call(tool: Tool) -> ToolCall | None:
    """A valid call to `tool` with every property it can fill (only the required ones if that fails)."""
    props = tool.input_schema.get("properties", {}) if isinstance(tool.input_schema, Mapping) else {}
    required = tool.input_schema.get("required", []) if isinstance(tool.input_schema, Mapping) else []
    full = {p: example_value(s, p) for p, s in props.items()}
    for arguments in (full, {p: v for p, v in full.items() if p in required}):
        call = ToolCall(tool.name, {p: v for p, v in arguments.items() if v is not None})
        if verify(call, [tool]).ok:
            return call
    return None



# --- sampled ---------------------------------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z][A-Za-z\-]{3,}")
_STOP = frozenset("that this with from have about what which would could there their they them then than into also "
                  "just like know need want some more most really help please make sure give find tell where when "
                  "your mine will been being were does very much many such only other each".split())

# Values a model would plausibly fill in for parameters with these words in their name.
_BY_NAME: tuple[tuple[str, Sequence[Any]], ...] = (
    ("date", ("2025-03-14", "2024-11-02", "2025-07-01")),
    ("time", ("2025-03-14T09:30:00Z", "14:00")),
    ("year", (2019, 2023, 2024)),
    ("city", ("Paris", "Boston", "San Jose", "Nairobi")),
    ("country", ("France", "Kenya", "Japan")),
    ("state", ("MA", "CA", "NY")),
    ("lat", (48.8566, 37.3382, -1.2921)),
    ("lon", (2.3522, -121.8863, 36.8219)),
    ("lng", (2.3522, -121.8863, 36.8219)),
    ("url", ("https://example.org/report", "https://en.wikipedia.org/wiki/Melanoma")),
    ("email", ("alex@example.org",)),
    ("path", ("./downloads", "/tmp/output")),
    ("language", ("en", "python")),
    ("currency", ("USD", "EUR")),
    ("unit", ("celsius", "meters", "kg")),
    ("symbol", ("BTC", "ETH", "AAPL")),
    ("gene", ("BRAF", "TP53", "EGFR")),
    ("drug", ("vemurafenib", "metformin", "ibuprofen")),
    ("disease", ("melanoma", "type 2 diabetes")),
    ("id", ("abc123", "NCT04280705", "2301.07041")),
    ("code", ("yose", "acad", "US")),
)


@lru_cache(maxsize=1024)
def request_words(text: str) -> tuple[str, ...]:
    """Content words of a request, in order, to fill free-text parameters with."""
    return tuple(dict.fromkeys(w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP)) or ("report",)


def _type_of(schema: Mapping[str, Any], rng: random.Random) -> tuple[str | None, Mapping[str, Any]]:
    for key in ("anyOf", "oneOf"):
        options = [o for o in schema.get(key) or () if isinstance(o, Mapping) and o.get("type") != "null"]
        if options:
            chosen = rng.choice(options)
            return _type_of({**{k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}, **chosen}, rng)
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    if t is None and "properties" in schema:
        t = "object"
    return t, schema


def _number(schema: Mapping[str, Any], rng: random.Random, integer: bool, name: str) -> int | float:
    low = schema.get("minimum", schema.get("exclusiveMinimum", 1 if integer else 0.5))
    high = schema.get("maximum", schema.get("exclusiveMaximum", max(low, 0) + (20 if integer else 100)))
    for word, values in _BY_NAME:
        if word in name and all(isinstance(v, (int, float)) and low <= v <= high for v in values):
            return rng.choice(list(values))
    if integer:
        lo = int(low) + (1 if "exclusiveMinimum" in schema else 0)
        hi = int(high) - (1 if "exclusiveMaximum" in schema else 0)
        return rng.randint(lo, max(lo, hi))
    return round(rng.uniform(float(low), float(high)), 3)


def _string(name: str, words: Sequence[str], rng: random.Random) -> str:
    key = name.lower()
    for word, values in _BY_NAME:
        if word in key and all(isinstance(v, str) for v in values):
            return rng.choice(list(values))
    start = rng.randrange(len(words))
    return " ".join(words[start:start + rng.randint(1, 3)])


def sampled_value(schema: Any, name: str, words: Sequence[str], rng: random.Random, depth: int = 0) -> Any:
    """One value that satisfies `schema` (the JSON Schema subset tool definitions use)."""
    if not isinstance(schema, Mapping):
        return _string(name, words, rng)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    t, schema = _type_of(schema, rng)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    if t == "integer":
        return _number(schema, rng, True, name.lower())
    if t == "number":
        return _number(schema, rng, False, name.lower())
    if t == "boolean":
        return rng.random() < 0.5
    if t == "array":
        if isinstance(schema.get("prefixItems"), list):
            return [sampled_value(item, name, words, rng, depth + 1) for item in schema["prefixItems"]]
        low = int(schema.get("minItems", 1))
        high = max(low, min(int(schema.get("maxItems", 3)), 3))
        item = schema.get("items", {"type": "string"})
        return [sampled_value(item, name, words, rng, depth + 1) for _ in range(rng.randint(low, high))]
    if t == "object":
        return sampled_arguments(schema, words, rng, depth + 1) if depth < 4 else {}
    return _string(name, words, rng)


def sampled_arguments(schema: Mapping[str, Any], words: Sequence[str], rng: random.Random, depth: int = 0,
                  optional_rate: float = 0.5) -> dict[str, Any]:
    """Every required parameter, and each optional one at `optional_rate`."""
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return {}
    required = set(schema.get("required") or ())
    args: dict[str, Any] = {}
    for name, prop in props.items():
        if name in required or rng.random() < optional_rate:
            args[name] = sampled_value(prop, name, words, rng, depth)
    return args
