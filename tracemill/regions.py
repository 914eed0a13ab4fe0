"""Where a model wrote its tool calls in text, by format: the reader's first look (`tracemill.reader`).

    found = regions(text, index)
    found.regions      # each place a call may be: its text, and the tool name when the format gives it apart
    found.why          # why the calls had to be extracted (None when the text is read whole)

Formats: `<tool_call>`, `<|python_start|>`, `<|python_tag|>`, `[TOOL_CALLS]` (with Mistral's `name[ARGS]`),
`<function=name>{json}</function>` and similar tags; Qwen3-Coder's XML calls, `<function=NAME><parameter=KEY>value
</parameter>...</function>`, each value typed by the schema, and a block whose closing tags were cut after its last
complete parameter; LangChain's classic ReAct text (`Action: TOOL` then `Action Input: {json}`, or plain text for a
tool with one parameter; nothing after the first `Observation:` is the model's, so nothing there is read); Markdown
fences (Gemma's ```` ```tool_code ```` blocks among them); else the whole text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracemill.jsonish import literal
from tracemill.names import match_tool
from tracemill.revision import Step, StepKind
from tracemill.tools import Tool, is_json_type, schema_types

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_TAGS = re.compile(
    r"<\|python_start\|>(?P<a>.*?)(?:<\|python_end\|>|$)"
    r"|<\|python_tag\|>(?P<b>.*?)(?:<\|eom_id\|>|<\|eot_id\|>|$)"
    r"|<(?P<tag>tool_call|tool_calls|tool_code|function_call|functioncall|tools)>(?P<c>.*?)(?:</(?P=tag)>|$)"
    r"|<\|tool_call\|>(?P<d>.*?)(?:<\|/tool_call\|>|<\|end\|>|$)"
    r"|(?P<fn_at><function=)"
    r"|\[TOOL_CALLS\](?P<f>.*)",
    re.DOTALL,
)
_FUNCTION = re.compile(r"<function=(?P<fn>[^>\s]+)>(?P<body>.*?)(?:</function>|(?=<function=)|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=(?P<key>[^>\n]+)>(?P<value>.*?)</parameter>", re.DOTALL)
_CLOSING = ("</function>", "</tool_call>")
_FENCE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)
_MISTRAL_ARGS = re.compile(r"\s*([\w.:\-]+)\s*\[ARGS\]", re.DOTALL)
_REACT = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*(?P<name>[^\n]+?)[ \t]*\n(?:[ \t]*\n)*"
                    r"[ \t]*Action[ \t]+Input[ \t]*:(?P<input>.*?)(?=^[ \t]*Observation[ \t]*:|\Z)",
                    re.DOTALL | re.MULTILINE)
_OBSERVATION = re.compile(r"^[ \t]*Observation[ \t]*:", re.MULTILINE)
_NAME_QUOTES = "`'\"*"
_JSON = json.JSONDecoder()


@dataclass(slots=True)
class Region:
    """One place a call may be. `name`: the tool name the format writes apart from the arguments, which are then the
    region's text, or already an object (`arguments`) for formats that give each parameter apart."""

    text: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    steps: list[Step] = field(default_factory=list)  # how the arguments were read, for formats that read them here
    refused: str | None = None  # why the call there cannot be read without making something up


@dataclass(slots=True)
class Found:
    regions: list[Region]
    why: str | None


def _tool(name: str, index: Mapping[str, Tool]) -> Tool | None:
    if name in index:
        return index[name]
    match = match_tool(name, index)
    return index[match[0]] if match else None


def _properties(tool: Tool | None) -> Mapping[str, Any]:
    props = tool.input_schema.get("properties") if tool is not None else None
    return props if isinstance(props, Mapping) else {}


# --- Qwen3-Coder's XML calls ----------------------------------------------------------------------------------------

def _typed(text: str, schema: Any) -> Any:
    """A parameter's text as the schema's type: kept as text where the schema takes a string (or says nothing), read
    as JSON or a Python literal where it does not and the value is of a type the schema takes."""
    types = schema_types(schema)
    if not types or "string" in types:
        return text
    try:
        value = literal(text.strip())
    except ValueError:
        return text
    return value if any(is_json_type(value, t) for t in types) else text


def _xml_call(name: str, body: str, index: Mapping[str, Tool], closed: bool) -> Region:
    props = _properties(_tool(name, index))
    arguments: dict[str, Any] = {}
    end = 0
    for match in _PARAMETER.finditer(body):
        if body[end:match.start()].strip():
            return Region(body, name, refused=f"text between the parameters of {name!r} is not a parameter")
        value = match.group("value")
        value = value.removeprefix("\n")
        value = value.removesuffix("\n")
        key = match.group("key").strip()
        arguments[key] = _typed(value, props.get(key))
        end = match.end()
    tail = body[end:].strip()
    if tail and not (not closed and any(c.startswith(tail) or tail.startswith(c) for c in _CLOSING)
                     and "<parameter=" not in tail):
        return Region(body, name, refused=f"the output ends in the middle of a parameter of {name!r}")
    steps = [Step(StepKind.XML_PARAMETERS, "read the parameters of an XML call, each typed by the schema")]
    if not closed:
        steps.append(Step(StepKind.CLOSE_BRACKETS, "the closing tags were cut after the last complete parameter"))
    return Region(body, name, arguments, steps)


def _functions(text: str, index: Mapping[str, Tool]) -> list[Region]:
    """`<function=NAME>` blocks: JSON arguments (Llama 3.1's format) or Qwen3-Coder's `<parameter=KEY>` children."""
    found = []
    for match in _FUNCTION.finditer(text):
        body, name = match.group("body"), match.group("fn")
        if "<parameter=" in body:
            found.append(_xml_call(name, body, index, match.group().endswith("</function>")))
        else:
            found.append(Region(body, name))
    return found


# --- LangChain's ReAct text -----------------------------------------------------------------------------------------

def _unquoted(text: str) -> str:
    """Plain text, or the string a quoted literal holds (`"Paris"` -> `Paris`)."""
    if text[:1] in "\"'" and text[-1:] == text[:1]:
        try:
            value = literal(text)
        except ValueError:
            return text
        return value if isinstance(value, str) else text
    return text


def _react(text: str, index: Mapping[str, Tool]) -> list[Region]:
    """The first `Action` / `Action Input` pair: what comes after an `Observation:` was made up by the model."""
    observation = _OBSERVATION.search(text)
    match = _REACT.search(text)
    if match is None or (observation is not None and observation.start() < match.start()):
        return []
    name = match.group("name").strip().strip(_NAME_QUOTES).strip()
    name = name.removesuffix("()")
    given = match.group("input").strip()
    fenced = _FENCE.fullmatch(given)
    given = fenced.group(1).strip() if fenced else given
    if given[:1] in "{[":
        try:
            _, end = _JSON.raw_decode(given)
        except ValueError:
            return [Region(given, name)]
        return [Region(given[:end], name)]
    props = _properties(_tool(name, index))
    if not given or len(props) != 1:
        return [Region(given, name)]
    (param, schema), = props.items()
    step = Step(StepKind.PLAIN_INPUT, f"read the plain-text Action Input as the tool's one parameter {param!r}")
    return [Region(given, name, {param: _typed(_unquoted(given), schema)}, [step])]


def regions(text: str, index: Mapping[str, Tool]) -> Found:
    """Where calls may be in `text` (see the module docstring), against the tools offered (`tool_index`), whose
    schemas type Qwen3-Coder's parameters and say which tools take one parameter."""
    if "<think>" in text:
        text = _THINK.sub("", text)
    tagged: list[Region] = []
    for m in _TAGS.finditer(text):
        if m.group("fn_at") is not None:
            tagged.extend(_functions(text[m.start():], index))
            break
        if m.group("f") is not None:
            body = m.group("f")
            mistral = _MISTRAL_ARGS.match(body)
            tagged.append(Region(body[mistral.end():], mistral.group(1)) if mistral else Region(body))
            continue
        body = next(g for g in (m.group("a"), m.group("b"), m.group("c"), m.group("d")) if g is not None)
        tagged.extend(_functions(body, index) if "<function=" in body else [Region(body)])
    if tagged:
        return Found(tagged, "read the call from between tool-call tags")
    react = _react(text, index) if "Action" in text else []
    if react:
        return Found(react, "read the call from a ReAct Action and Action Input")
    fenced = [Region(m.group(1)) for m in _FENCE.finditer(text)]
    if fenced:
        return Found(fenced, "read the call from a Markdown code block")
    return Found([Region(text)], None)
