"""The one prompt a model reviser sees, built the same way for mining, training and serving.

A prompt holds the model's raw output, the conversation it answered (the newest turns that fit a token budget, the
user's last request always among them) and a compact tool context: the tools the output names and their nearest
neighbours by name and description, never the whole list (agent contexts reach 57k-128k tokens; the reviser must not
need them). Sections are tagged plain text, so that JSON in the output is not escaped twice:

    system: how to answer                      (left out with `PromptSettings(system=False)`)
    user:   <tools>one JSON tool per line</tools>
            <conversation>role: text, one turn per line</conversation>
            <output>the raw output</output>

The answer a reviser gives is the intended call, or a JSON array of calls, as `{"name": ..., "arguments": {...}}`.
`PromptSettings` are recorded with every dataset and model, so that a model is always asked the way it was trained.
"""

from __future__ import annotations

import heapq
import operator
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import orjson

from tracemill.names import match_tool, similarity
from tracemill.reader import Reading, read
from tracemill.short_cache import cache_short
from tracemill.tools import Tool, base_key, name_key

SYSTEM = ("You repair tool calls. Given the tools, the conversation and a model's output, reply with only the tool "
          'call the model meant, as JSON: {"name": ..., "arguments": {...}}, or a JSON array of such calls. Use only '
          "values found in the output or the conversation; never make up a value. If the output is already a valid "
          "call, repeat it unchanged.")
_WORDS = re.compile(r"[a-z0-9]+")
_IDENTIFIERS = re.compile(r"[A-Za-z_][\w.:\-]*")
_NOT_CONVERSATION = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class PromptSettings:
    max_tools: int = 4  # the tools the output names, then their nearest neighbours
    budget_tokens: int = 1024  # for the conversation; the tools and the output always go in whole
    descriptions: bool = True  # each tool's description, cut to `description_chars`
    description_chars: int = 300
    parameter_descriptions: bool = True  # the descriptions inside the input schema
    system: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PromptSettings:
        known = {k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True, slots=True)
class ReviserPrompt:
    messages: tuple[dict[str, str], ...]  # {"role", "content"}, as chat templates and TRL's conversational data take
    tools: tuple[Tool, ...]  # the tools the prompt shows
    sections: tuple[str, ...]  # the last message's content, a line (or a turn, or the output) each, before joining
    tools_json: str  # `tools` as a JSON array of MCP tool definitions (`Tool.to_mcp`), as datasets hold them

    def to_list(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.messages]


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate (about four characters a token), for when no tokenizer is at hand."""
    return len(text) // 4 + 1


def _words(text: str) -> set[str]:
    return {w for w in _WORDS.findall(re.sub(r"(?<=[a-z])([A-Z])", r" \1", text).lower()) if len(w) > 2}


@lru_cache(maxsize=65536)
def _keys(name: str) -> tuple[str, str]:
    """The `name_key` of a name and of its base name, as name scores compare them."""
    return name_key(name), base_key(name)


# by keys, not names: spellings of a name share them, and a name's base key is often another's (`Server:get_x`, `get_x`)
_key_similarity = lru_cache(maxsize=65536)(similarity)


def _name_score(name: str, tool: str) -> float:
    (full_a, short_a), (full_b, short_b) = _keys(name), _keys(tool)
    full = _key_similarity(full_a, full_b)
    if (short_a, short_b) == (full_a, full_b):  # neither name has a prefix: the same pair
        return full
    return max(full, _key_similarity(short_a, short_b))


@lru_cache(maxsize=65536)
def _letters(key: str) -> Counter[str]:
    return Counter(key)


def _ratio_may_beat(a: str, b: str, best: float) -> bool:
    """Whether `similarity(a, b)` can be more than `best`: twice the letters the two share, over both lengths, bounds
    it (difflib's `quick_ratio`), and twice the shorter length over both bounds that (`real_quick_ratio`)."""
    if not a or not b:
        return (0.0 if a or b else 1.0) > best
    both = len(a) + len(b)
    return 2.0 * min(len(a), len(b)) / both > best and 2.0 * sum((_letters(a) & _letters(b)).values()) / both > best


def _may_beat(name: str, tool: str, best: float) -> bool:
    """Whether `_name_score(name, tool)` can be more than `best`."""
    (full_a, short_a), (full_b, short_b) = _keys(name), _keys(tool)
    return _ratio_may_beat(full_a, full_b, best) or _ratio_may_beat(short_a, short_b, best)


@lru_cache(maxsize=16384)
def _name_scores(names: tuple[str, ...], tools: tuple[str, ...]) -> tuple[float, ...]:
    """Each tool's best name score against the names an output gives (outputs repeat names: computed once). A pair
    whose bound cannot beat the best score so far is not scored; while that best is 0 no bound is asked (a bound of 0
    is a score of 0)."""
    scores = []
    for tool in tools:
        best = 0.0
        for name in names:
            if not best or _may_beat(name, tool, best):
                best = max(best, _name_score(name, tool))
        scores.append(best)
    return tuple(scores)


@lru_cache(maxsize=16384)
def _near_miss(name: str, offered: tuple[str, ...]) -> str | None:
    """`match_tool` over the offered names (it reads names only), once per name and tool list."""
    return (match_tool(name, dict.fromkeys(offered)) or (None, ""))[0]  # type: ignore[arg-type]


@cache_short(limit=2048, maxsize=4096)  # a conversation's request comes back with each of its calls
def _request_words(request: str) -> frozenset[str]:
    return frozenset(_words(request))


@dataclass(slots=True, eq=False)  # hashed by identity: a key of the rankings made against it
class _Catalog:
    """What prompts need of one tool index, worked out once however many outputs are read against it."""

    tools: tuple[Tool, ...]
    offered: tuple[str, ...]  # the index's keys
    names: tuple[str, ...]  # each tool's own name
    bits: dict[str, int]  # each word of the tools' names and descriptions -> a bit of its own
    masks: tuple[int, ...]  # each tool's words, as the OR of their bits
    lines: dict[tuple[PromptSettings, int], str]  # a tool's line in the prompt, by settings and position
    mcp: dict[int, str]  # a tool's MCP definition as JSON, by position

    def mask(self, words: set[str]) -> int:
        """The words the catalog knows, as one int of their bits."""
        return sum(map(self.bits.__getitem__, self.bits.keys() & words))


_CATALOGS: dict[int, _Catalog] = {}  # by id(index): a hit holds the very same Tool objects, or it is made anew


def _catalog(index: Mapping[str, Tool]) -> _Catalog:
    tools = tuple(index.values())
    found = _CATALOGS.get(id(index))
    if found is not None and len(found.tools) == len(tools) and all(map(operator.is_, found.tools, tools)):
        return found
    about = [frozenset(_words(f"{t.name} {t.description}")) for t in tools]
    bits = {word: 1 << n for n, word in enumerate(sorted(frozenset().union(*about)))}
    if len(_CATALOGS) >= 1024:
        _CATALOGS.clear()
    found = _CATALOGS[id(index)] = _Catalog(tools, tuple(index), tuple(t.name for t in tools), bits,
                                            tuple(sum(map(bits.__getitem__, a)) for a in about), {}, {})
    return found


def nearest_tools(raw: str, index: Mapping[str, Tool], request: str = "", k: int = 4,
                  reading: Reading | None = None) -> list[Tool]:
    """The tools the output names (as the reviser reads names: `reading`, where the caller has read `raw` already),
    then the ones closest to those names and to the words of the output and the request, `k` at most."""
    return [t for _, t in _nearest(raw, index, _catalog(index), request, k, reading)]


def _nearest(raw: str, index: Mapping[str, Tool], catalog: _Catalog, request: str, k: int,
             reading: Reading | None) -> list[tuple[int, Tool]]:
    """`nearest_tools` with each tool's position in `catalog`, the catalog of `index`."""
    reading = read(raw, index) if reading is None else reading
    names = [c.name for c in reading.calls if isinstance(c.name, str) and c.name]
    if not names:
        names = [w for w in _IDENTIFIERS.findall(raw) if len(w) > 3][:20]
    chosen: dict[str, int] = {}
    for name in names:
        hit = name if name in index else _near_miss(name, catalog.offered)
        if hit is not None and len(chosen) < k:
            chosen[hit] = catalog.offered.index(hit)
    need = k - len(chosen)
    if need > 0:
        said = catalog.mask(_words(raw) | _request_words(request))
        chosen.update(_closest(catalog, tuple(names), said, tuple(chosen), need))
    return [(position, catalog.tools[position]) for position in chosen.values()]


@lru_cache(maxsize=16384)
def _closest(catalog: _Catalog, names: tuple[str, ...], said: int, taken: tuple[str, ...],
             need: int) -> tuple[tuple[str, int], ...]:
    """The `need` tools not `taken` closest to the names an output gives and to the words of the output and the
    request that the catalog knows (`said`, `_Catalog.mask`), as (name, position), the closest first (outputs that
    name the same tools with the same words are ranked once)."""
    by_names = _name_scores(names, catalog.offered)
    scored = [(-(score + 0.5 * ((said & mask).bit_count() / mask.bit_count() if mask else 0.0)), name, position)
              for position, (name, score, mask) in enumerate(zip(catalog.names, by_names, catalog.masks, strict=True))
              if name not in taken]  # the best first, ties by name
    best = heapq.nsmallest(need, scored) if need < len(scored) else sorted(scored)
    return tuple((name, position) for _, name, position in best)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(filter(None, map(_part_text, value)))
    if value is None:
        return ""
    return orjson.dumps(value, default=str).decode()


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if type(part) is not dict and not isinstance(part, Mapping):  # a dict, nearly always: no ABC check
        return ""
    kind = part.get("type")
    if kind == "tool_call":
        return _call_text(part.get("name"), part.get("arguments"))
    if kind == "tool_call_response":
        return _text(part.get("response"))
    if isinstance(kind, str) and (media := _MEDIA.get(kind)) is not None:
        return f"[{part.get('modality') or media}]"
    return _text(part.get("text", part.get("content")))


# media parts (GenAI's blob, uri and file, with their modality; OpenAI's and Anthropic's): shown as their kind, never
# as their bytes (a vision agent's screenshots, base64 in every turn)
_MEDIA = {"blob": "file", "uri": "file", "file": "file", "image_url": "image", "input_image": "image", "image": "image",
          "input_audio": "audio", "audio": "audio", "input_file": "file", "document": "file"}


def _call_text(name: Any, arguments: Any) -> str:
    shown = arguments if isinstance(arguments, str) else orjson.dumps(arguments, default=str).decode()
    return f"{name}({shown})"


def _role(message: Any) -> str:
    if type(message) is not dict and not isinstance(message, Mapping):
        return "user"
    return str(message.get("role") or message.get("type") or "user")


def message_text(message: Any) -> tuple[str, str]:
    """(role, text) of one conversation message: OpenAI chat, GenAI (`parts`) or LangChain shaped, or a string."""
    if isinstance(message, str):
        return "user", message
    if type(message) is not dict and not isinstance(message, Mapping):
        return "user", _text(message)
    role = _role(message)
    pieces = [_text(message.get("parts") if "parts" in message else message.get("content"))]
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping):
            function = call.get("function") if isinstance(call.get("function"), Mapping) else call
            pieces.append(_call_text(function.get("name"), function.get("arguments", function.get("args"))))
    return role, " ".join(p for p in pieces if p)


def conversation(context: Sequence[Any] | None, budget_tokens: int,
                 count_tokens: Callable[[str], int] = approx_tokens) -> list[str]:
    """The turns of a conversation as `role: text` lines: the newest that fit the budget, in order. The user's last
    request is always kept, cut to the budget when it alone is over it. System prompts are left out."""
    return _newest_turns(context or (), budget_tokens, count_tokens)[0]


def _newest_turns(context: Sequence[Any], budget_tokens: int,
                  count_tokens: Callable[[str], int]) -> tuple[list[str], str]:
    """`conversation`'s turns, and the text of the user's last request (`nearest_tools` ranks by its words). Only the
    messages the budget reaches are read, from the newest back: an agent's context runs to hundreds of turns, and each
    of its calls would read them all again."""
    request: str | None = None  # the request's text, for ranking: the last user turn's, even where empty
    asked: str | None = None  # the request's line, the last user turn with text: kept whatever the budget
    at = -1
    for i in range(len(context) - 1, -1, -1):
        if _role(context[i]) in ("user", "human"):
            role, text = message_text(context[i])
            if request is None:
                request = text
            if text:
                asked, at = f"{role}: {text}", i
                break
    used = 0
    if asked is not None:
        cost = count_tokens(asked)
        if cost > budget_tokens:
            asked = asked[: max(1, len(asked) * budget_tokens // cost)]
        used = count_tokens(asked)
    newer, used, full = _lines_that_fit(context, range(len(context) - 1, at, -1), used, budget_tokens, count_tokens)
    older = _lines_that_fit(context, range(at - 1, -1, -1), used, budget_tokens, count_tokens)[0] if not full else []
    turns = [*reversed(older), *([asked] if asked is not None else []), *reversed(newer)]
    return turns, request or ""


def _lines_that_fit(context: Sequence[Any], indices: range, used: int, budget_tokens: int,
                    count_tokens: Callable[[str], int]) -> tuple[list[str], int, bool]:
    """The `role: text` lines of the messages at `indices`, in that order, while they fit the budget: the lines, the
    tokens then used and whether one did not fit."""
    lines: list[str] = []
    for i in indices:
        if _role(context[i]) in _NOT_CONVERSATION:
            continue
        role, text = message_text(context[i])
        if not text:
            continue
        line = f"{role}: {text}"
        cost = count_tokens(line)
        if used + cost > budget_tokens:
            return lines, used, True
        lines.append(line)
        used += cost
    return lines, used, False


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "contains")


def _without_descriptions(schema: Any) -> Any:
    """A JSON Schema with the `description` keyword left out of every (sub)schema; property names are kept."""
    if not isinstance(schema, Mapping):
        return schema
    out = {k: v for k, v in schema.items() if not (k == "description" and isinstance(v, str))}
    for key, value in out.items():
        if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, Mapping):
            out[key] = {name: _without_descriptions(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [_without_descriptions(sub) for sub in value]
        elif key in _SUBSCHEMAS:
            out[key] = _without_descriptions(value)
    return out


def _tool_line(tool: Tool, settings: PromptSettings) -> str:
    shown: dict[str, Any] = {"name": tool.name}
    if settings.descriptions and tool.description:
        shown["description"] = tool.description[: settings.description_chars]
    schema = dict(tool.input_schema)
    shown["parameters"] = schema if settings.parameter_descriptions else _without_descriptions(schema)
    return orjson.dumps(shown).decode()


def build_prompt(raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None,
                 settings: PromptSettings = PromptSettings(),
                 count_tokens: Callable[[str], int] = approx_tokens, reading: Reading | None = None) -> ReviserPrompt:
    """The reviser's prompt for one model output (`index`: the tools offered, as `tool_index` builds them;
    `reading`: `read(raw, index)` where the caller has it already)."""
    turns, request = _newest_turns(context or (), settings.budget_tokens, count_tokens)
    catalog = _catalog(index)
    nearest = _nearest(raw, index, catalog, request, settings.max_tools, reading)
    lines = catalog.lines
    for position, tool in nearest:
        if (settings, position) not in lines:
            lines[settings, position] = _tool_line(tool, settings)
        if position not in catalog.mcp:
            catalog.mcp[position] = orjson.dumps(tool.to_mcp(), default=str).decode()
    sections = ["<tools>", *(lines[settings, p] for p, _ in nearest), "</tools>"]
    if turns:
        sections += ["<conversation>", *turns, "</conversation>"]
    sections += ["<output>", raw, "</output>"]
    user = {"role": "user", "content": "\n".join(sections)}
    messages = ({"role": "system", "content": SYSTEM}, user) if settings.system else (user,)
    tools_json = "[" + ",".join(catalog.mcp[p] for p, _ in nearest) + "]"
    return ReviserPrompt(messages, tuple(t for _, t in nearest), tuple(sections), tools_json)
