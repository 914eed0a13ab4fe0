"""The reviser seam: one contract for everything that turns a model's output into valid tool calls, and one registry.

A reviser is called as `reviser(raw, index, context)`, like `tracemill.repair.revise`:

- `raw` is the model's output as text (a native call's JSON, or text that holds calls), `index` the tools it was
  offered (`tracemill.tools.tool_index`), `context` the conversation it answered (a list of messages) or None;
- it returns a `Revision`: the calls, `ok` when each is valid against its tool, `changed`, the steps it took, and one
  Verdict per call saying what is still wrong when not ok;
- it never changes a call that was already valid, never makes up a value it cannot find in the output or the context,
  and says why (in the verdicts) rather than guess.

Revisers are named by a spec string: `none`, `json-repair`, `rules`, `endpoint:URL`, and whatever a plugin registers
(the trainer's `model:PATH`). The built-in ones are registered here through the same `register` call a plugin uses; a
plugin registers from the `tracemill.revisers` entry point group, whose entries name a callable taking the spec's
argument (the text after `name:`, or "") and returning a reviser.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol

import json_repair

from tracemill.repair import revise
from tracemill.reviser_prompt import PromptSettings, build_prompt
from tracemill.revision import Revision, Step, StepKind
from tracemill.tools import Tool
from tracemill.verify import Stage, ToolCall, Verdict, Violation, parse_call, verify

ENTRY_POINT_GROUP = "tracemill.revisers"


class Reviser(Protocol):
    def __call__(self, raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None) -> Revision: ...


class ReviserSpecError(ValueError):
    """A reviser spec that names no registered reviser, or one that cannot be made; the message says which and why."""


class ReviserUnavailable(RuntimeError):
    """A reviser that could not answer: its endpoint unreachable, answering with an error or not as the API it should
    be; the message names it and says why."""


Factory = Callable[[str], Reviser]


@dataclass(frozen=True, slots=True)
class Registered:
    name: str
    factory: Factory
    takes_argument: bool  # spec `name:ARGUMENT` rather than `name`
    help: str


_registry: dict[str, Registered] = {}
_plugins_loaded = False


def register(name: str, factory: Factory, *, takes_argument: bool = False, help: str = "") -> None:
    """Make `name` (or `name:ARGUMENT` when `takes_argument`) a reviser spec. A later registration of a name wins."""
    _registry[name] = Registered(name, factory, takes_argument, help)


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in _registry:
            continue
        try:
            factory = entry.load()
        except ImportError as exc:
            register(entry.name, _unavailable(entry.name, entry.extras, exc), takes_argument=True)
        else:
            register(entry.name, factory, takes_argument=bool(getattr(factory, "takes_argument", True)),
                     help=getattr(factory, "spec_help", ""))


def _unavailable(name: str, extras: list[str], exc: ImportError) -> Factory:
    needs = f"pip install 'tracemill[{','.join(extras)}]'" if extras else "its plugin's requirements"
    def factory(argument: str) -> Reviser:
        raise ReviserSpecError(f"the {name!r} reviser cannot be loaded ({exc}): it needs {needs}")
    return factory


def registered() -> list[Registered]:
    _load_plugins()
    return sorted(_registry.values(), key=lambda r: r.name)


def spec_names() -> str:
    """The spec forms, for help texts and errors: `none | json-repair | rules | endpoint:URL | ...`."""
    return " | ".join(f"{r.name}:{'URL' if r.name == 'endpoint' else 'PATH'}" if r.takes_argument else r.name
                      for r in registered())


def make_reviser(spec: str) -> Reviser:
    """The reviser a spec names. Raises ReviserSpecError."""
    _load_plugins()
    name, sep, argument = spec.partition(":")
    found = _registry.get(name)
    if found is None or found.takes_argument != bool(sep) or (found.takes_argument and not argument):
        raise ReviserSpecError(f"unknown reviser {spec!r}: use {spec_names()}")
    return found.factory(argument)


# --- built-in revisers ----------------------------------------------------------------------------------------------

def _strict_calls(value: Any) -> list[ToolCall] | None:
    items = value if isinstance(value, list) else [value]
    calls = [parse_call(item) for item in items]
    if not items or any(isinstance(c, Verdict) for c in calls):
        return None
    return [c for c in calls if isinstance(c, ToolCall)]


def strict_calls(raw: str) -> list[ToolCall] | None:
    """The calls as sent, read strictly: one call object or a JSON array of them; None when that fails."""
    try:
        return _strict_calls(json.loads(raw))
    except (ValueError, RecursionError):
        return None


def _as_revision(calls: list[ToolCall] | None, index: Mapping[str, Tool], changed: bool) -> Revision:
    if calls is None:
        failure = Violation(Stage.PARSE, "invalid_json", "", "not one call object or a JSON array of them")
        return Revision((), False, changed, (), (Verdict(False, Stage.PARSE, (failure,)),))
    verdicts = tuple(verify(c, index) for c in calls)
    return Revision(tuple(calls), bool(calls) and all(v.ok for v in verdicts), changed, (), verdicts)


def no_reviser(raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None) -> Revision:
    """The output as sent, read strictly: "before"."""
    return _as_revision(strict_calls(raw), index, False)


def json_repair_reviser(raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None) -> Revision:
    """json-repair alone: repair the text as JSON, then read it strictly."""
    before = strict_calls(raw)
    if before is not None:
        return _as_revision(before, index, False)
    try:
        repaired = json_repair.loads(raw)
    except Exception:  # a heuristic that gives up is a reviser that found nothing
        return _as_revision(None, index, True)
    return _as_revision(_strict_calls(repaired), index, True)


def rules_reviser(raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None) -> Revision:
    """The deterministic reviser (`tracemill.repair.revise`)."""
    return revise(raw, index, context)


def model_answer(first: Revision, raw: str, answer: str | Mapping[str, Any], index: Mapping[str, Tool],
                 context: Sequence[Any] | None, who: str) -> Revision:
    """A model reviser's result: its answer read and fixed as `revise` reads any output, kept only when it is valid.
    Otherwise, and always for an output that was valid as sent, what the rules made of the output (`first`) stands."""
    second = revise(answer, index, context)
    if not second.ok or (first.ok and not first.changed):
        return first
    step = Step(StepKind.MODEL, f"{who} rewrote the output", None, "", raw, [c.to_dict() for c in second.calls])
    return Revision(second.calls, True, True, (*first.steps, step, *second.steps), second.verdicts)


@dataclass(slots=True)
class EndpointReviser:
    """A model reviser behind any OpenAI-compatible chat endpoint (vLLM, llama.cpp, Ollama, a hosted API), asked only
    where the rules cannot make the output valid (or always, with `always`), with the kernel's reviser prompt."""

    url: str
    model: str = "tracemill-reviser"
    always: bool = False
    timeout: float = 60.0
    prompt: PromptSettings = PromptSettings()

    @property
    def chat_url(self) -> str:
        url = self.url.rstrip("/")
        return url if url.endswith("/chat/completions") else url + "/chat/completions"

    def __call__(self, raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None) -> Revision:
        import httpx

        first = revise(raw, index, context)
        if first.ok and not (self.always and first.changed):
            return first
        prompt = build_prompt(raw, index, context, self.prompt)
        body = {"model": self.model, "temperature": 0, "messages": prompt.to_list()}
        try:
            response = httpx.post(self.chat_url, json=body, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise ReviserUnavailable(f"cannot reach the model reviser at {self.chat_url}: {exc}") from exc
        if response.is_error:
            raise ReviserUnavailable(f"the model reviser at {self.chat_url} answered {response.status_code}: "
                                     f"{_gist(response.text)}")
        try:
            message = response.json()["choices"][0]["message"]
            answer = message if message.get("tool_calls") else message.get("content") or ""
        except (ValueError, LookupError, TypeError, AttributeError) as exc:
            raise ReviserUnavailable(f"the model reviser at {self.chat_url} did not answer as an OpenAI-compatible "
                                     f"chat endpoint does (no choices[0].message): {_gist(response.text)}") from exc
        return model_answer(first, raw, answer, index, context, f"the model reviser at {self.url}")


def _gist(text: str) -> str:
    """The start of what an endpoint answered, on one line."""
    return " ".join(text.split())[:300]


register("none", lambda _: no_reviser, help="the output as sent")
register("json-repair", lambda _: json_repair_reviser, help="json-repair alone")
register("rules", lambda _: rules_reviser, help="the deterministic reviser")
register("endpoint", EndpointReviser, takes_argument=True,
         help="a model reviser behind an OpenAI-compatible endpoint (its /v1 base URL)")
