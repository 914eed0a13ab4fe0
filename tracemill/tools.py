"""MCP tool definitions: one shape (`Tool`) for MCP, MCP-Bench, OpenAI and BFCL inputs; tool lists indexed by name and
hashed; how tool and parameter names are compared (`name_key`, `base_name`) and what types a schema admits."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import orjson

# BFCL writes Python type names where JSON Schema expects its own.
_PYTHON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array", "int": "integer",
                 "str": "string", "bool": "boolean"}


class ToolFormatError(ValueError):
    """A tool definition that cannot be read; the message names what is wrong and where."""


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})

    def to_mcp(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "inputSchema": dict(self.input_schema)}

    def to_openai(self) -> dict[str, Any]:
        """As an OpenAI chat completions request offers it."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.input_schema)}}


def _json_schema_types(schema: Any) -> Any:
    """Rewrite BFCL's Python-flavoured `type` values (`dict`, `float`, `tuple`, `any`) to JSON Schema, recursively."""
    if isinstance(schema, list):
        return [_json_schema_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            if value == "any":
                continue
            out[key] = _PYTHON_TYPES.get(value, value)
        elif key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {k: _json_schema_types(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "anyOf", "oneOf", "allOf", "prefixItems", "contains"):
            out[key] = _json_schema_types(value)
        else:
            out[key] = value
    return out


def normalize_tool(obj: Any, where: str = "tool") -> Tool:
    """Read one tool in MCP (`inputSchema`), MCP-Bench (`input_schema`), OpenAI (`{"type":"function","function":{}}`)
    or BFCL/OpenAI-function (`parameters`) shape."""
    if isinstance(obj, Tool):
        return obj
    if not isinstance(obj, Mapping):
        raise ToolFormatError(f"{where}: expected an object, got {type(obj).__name__}")
    if obj.get("type") == "function" and isinstance(obj.get("function"), Mapping):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ToolFormatError(f"{where}: 'name' must be a non-empty string")
    schema: Any = None
    for key in ("inputSchema", "input_schema", "parameters"):
        if key in obj and obj[key] is not None:
            schema = obj[key]
            break
    if schema is None:
        schema = {"type": "object"}
    if not isinstance(schema, Mapping):
        raise ToolFormatError(f"{where} {name!r}: input schema must be an object, got {type(schema).__name__}")
    description = obj.get("description") or ""
    if not isinstance(description, str):
        description = str(description)
    return Tool(name=name, description=description, input_schema=_json_schema_types(dict(schema)))


def normalize_tools(tools: Iterable[Any] | None) -> list[Tool]:
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, Mapping)):
        raise ToolFormatError(f"tools: expected a list of tools, got {type(tools).__name__}")
    return [normalize_tool(t, where=f"tools[{i}]") for i, t in enumerate(tools)]


def tool_index(tools: Iterable[Any]) -> dict[str, Tool]:
    """Tools in any accepted shape, by name: what `verify` and `revise` take to check many calls against one list."""
    return {t.name: t for t in normalize_tools(tools)}


_SEPARATORS = re.compile(r"[\s_\-.:/]+")
_PREFIX = re.compile(r"[:./]|__")


@lru_cache(maxsize=65536)
def name_key(name: str) -> str:
    """A name with case and separators (`_ - . : /`, spaces) folded away: `Get-Weather` and `get_weather` match."""
    return _SEPARATORS.sub("", name).casefold()


def name_parts(name: str) -> list[str]:
    """A name split at its server or namespace separators (`:`, `.`, `/`, `__`): `Server:tool` -> `Server`, `tool`."""
    return _PREFIX.split(name)


def base_name(name: str) -> str:
    """A tool's own name, without the server or namespace prefix a model or MCP-Bench put before it."""
    return name_parts(name)[-1]


def base_key(name: str) -> str:
    """The `name_key` of a name's base name: `Server:get_weather` and `functions.GetWeather` match."""
    return name_key(base_name(name))


def schema_types(schema: Any) -> set[str]:
    """The JSON types a schema admits, looking into `anyOf`/`oneOf`; empty when it does not say."""
    if not isinstance(schema, Mapping):
        return set()
    t = schema.get("type")
    found = {t} if isinstance(t, str) else {x for x in t if isinstance(x, str)} if isinstance(t, list) else set()
    for key in ("anyOf", "oneOf"):
        alternatives = schema.get(key)
        if isinstance(alternatives, list):
            for alt in alternatives:
                found |= schema_types(alt)
    return found


def is_json_type(value: Any, t: str) -> bool:
    """Whether a decoded JSON value is of JSON Schema type `t` (a bool is no number)."""
    if t == "string":
        return isinstance(value, str)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "array":
        return isinstance(value, list)
    if t == "object":
        return isinstance(value, dict)
    return t == "null" and value is None


def toolset_hash(tools: Iterable[Tool]) -> str:
    """Stable hash of a tool list: the same tools in any order hash alike."""
    canonical = sorted(orjson.dumps(t.to_mcp(), option=orjson.OPT_SORT_KEYS) for t in tools)
    return hashlib.sha256(b"\n".join(canonical)).hexdigest()


def load_mcp_bench(path: str | None = None, qualified: bool = True) -> dict[str, list[Tool]]:
    """MCP-Bench's `mcp_servers_info.json` as {server: tools}. With `qualified`, names are `Server Name:tool`, as
    MCP-Bench shows them to the model. Without a path, the copy shipped in the package."""
    if path is None:
        raw = resources.files("tracemill").joinpath("data/mcp_bench/mcp_servers_info.json").read_bytes()
    else:
        with open(path, "rb") as fh:
            raw = fh.read()
    data = orjson.loads(raw)
    servers: dict[str, list[Tool]] = {}
    for server, info in data["servers"].items():
        tools = []
        for tool_name, tool in info.get("tools", {}).items():
            t = normalize_tool(tool, where=f"{server}/{tool_name}")
            if qualified:
                t = Tool(name=f"{server}:{t.name}", description=t.description, input_schema=t.input_schema)
            tools.append(t)
        servers[server] = tools
    return servers
