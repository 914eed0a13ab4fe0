"""The tools of a request, read once per distinct list: agents send the same tools with every request."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from tracemill.sdk import genai
from tracemill.tools import Tool, tool_index


@dataclass(slots=True)
class Toolset:
    index: Mapping[str, Tool]
    tools: list[Any]
    _definitions: str | None = field(default=None)

    def definitions(self) -> str:
        """As GenAI tool definitions (JSON text), for the trace."""
        if self._definitions is None:
            self._definitions = genai.tool_definitions_json(self.tools)
        return self._definitions


class Toolsets:
    def __init__(self, size: int = 512) -> None:
        self._size = size
        self._cache: OrderedDict[bytes, Toolset] = OrderedDict()

    def get(self, tools: list[Any]) -> Toolset:
        """Raises tracemill.tools.ToolFormatError for a tool that cannot be read."""
        key = orjson.dumps(tools)
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
            return found
        found = Toolset(tool_index(tools), tools)
        self._cache[key] = found
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return found
