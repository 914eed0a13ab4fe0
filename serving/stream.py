"""A streamed chat completion (server-sent events) passed through with its tool calls held back until complete.

Text goes out as it comes, up to where a call may start (a tag, a fence, JSON, `Action:`, an offered tool's name
followed by `(`); from there it is held to the end of the choice, then sent as the reviser's calls when it holds a
valid one, else as the text it was. Native tool-call deltas are held until the choice finishes, checked, revised where
broken, and sent as one delta per call in OpenAI's streaming format, then the choice's finish. Chunks that need none
of this go out as the upstream sent them, byte for byte.

    streamer = Streamer(index, text_calls=True)
    for event in events:                      # each `data:` event, as bytes
        send(streamer.feed(event))
        for choice in streamer.finished():    # choices whose finish arrived
            seen = streamer.look(choice)      # cheap; revise only when seen.needed
            send(streamer.close(choice, revised_or_none, extension))
    for choice in streamer.unfinished(): ...  # at the end: choices the upstream never finished; then [DONE]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from tracemill.serving.revising import REVISED, Look, Revised, hold_at, look, releasable
from tracemill.tools import Tool

DONE = b"data: [DONE]\n\n"


def event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def data_of(raw: bytes) -> bytes | None:
    """The data of one server-sent event; None for an event without data (a comment, a keep-alive)."""
    lines = [line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


class EventSplitter:
    """Bytes as they arrive -> whole events (each ending in a blank line)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer + data
        if b"\r" in buffer:  # normalised here, not per read: a read may end between the \r and the \n
            buffer = buffer.replace(b"\r\n", b"\n")
        *whole, self._buffer = buffer.split(b"\n\n")
        return [e + b"\n\n" for e in whole if e]

    def rest(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        return rest + b"\n\n" if rest.strip() else b""


@dataclass(slots=True)
class _Choice:
    sent: list[str] = field(default_factory=list)  # text released
    pending: str = ""  # text held back for now: it may grow into a marker
    held: str = ""  # text held to the end: a call may start there
    holding: bool = False
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[Any] = field(default_factory=list)  # of the tokens whose text is held, sent with it
    finish: dict[str, Any] | None = None  # the finishing choice, less its delta
    usage: Any = None  # the usage that came with the finish, sent with it
    closed: bool = False

    def content(self) -> str | None:
        text = "".join(self.sent) + self.pending + self.held
        return text or None

    def tool_calls(self) -> list[dict[str, Any]]:
        return [self.calls[k] for k in sorted(self.calls)]


def _logprobs(item: Mapping[str, Any]) -> list[Any]:
    """The token logprobs of a streamed choice (`logprobs.content`), or none."""
    logprobs = item.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    return list(content) if isinstance(content, list) else []


class Streamer:
    def __init__(self, index: Mapping[str, Tool], text_calls: bool) -> None:
        self.index = index
        self.text_calls = text_calls
        self.choices: dict[int, _Choice] = {}
        self.template: dict[str, Any] = {"object": "chat.completion.chunk"}
        self.usage: Any = None
        self.done = False  # the upstream sent [DONE]
        self._finished: list[int] = []

    # --- in ---

    def _text(self, choice: _Choice, text: str) -> str:
        """The part of a content delta to send now."""
        if not self.text_calls or choice.calls:
            choice.sent.append(text)
            return text
        if choice.holding:
            choice.held += text
            return ""
        buffer = choice.pending + text
        at = hold_at(buffer, self.index)
        if at is not None:
            choice.holding, choice.held, choice.pending = True, buffer[at:], ""
            release = buffer[:at]
        else:
            cut = releasable(buffer)
            release, choice.pending = buffer[:cut], buffer[cut:]
        choice.sent.append(release)
        return release

    @staticmethod
    def _call_delta(choice: _Choice, delta: Mapping[str, Any]) -> None:
        call = choice.calls.setdefault(int(delta.get("index", len(choice.calls))),
                                       {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        if delta.get("id"):
            call["id"] = delta["id"]
        function = delta.get("function") if isinstance(delta.get("function"), Mapping) else {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def feed(self, raw: bytes) -> list[bytes]:
        """What to send now for one upstream event."""
        data = data_of(raw)
        if data == b"[DONE]":
            self.done = True
            return []
        if data is None:
            return [raw]
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return [raw]
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            return [raw]  # an error object, or something this proxy does not read
        self.template = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        usage = chunk.get("usage")
        self.usage = usage or self.usage
        untouched = True
        out: list[dict[str, Any]] = []
        for item in chunk["choices"]:
            if not isinstance(item, dict):
                continue
            at = int(item.get("index", 0))
            choice = self.choices.setdefault(at, _Choice())
            delta = item.get("delta") if isinstance(item.get("delta"), dict) else {}
            kept = {k: v for k, v in delta.items() if k not in ("content", "tool_calls")}
            shown = {k: v for k, v in item.items() if k not in ("delta", "finish_reason")}
            text = delta.get("content")
            if isinstance(text, str) and text:
                release = self._text(choice, text)
                if release != text:  # some text held: its tokens' logprobs go out with it, when it does
                    untouched = False
                    choice.logprobs += _logprobs(item)
                    shown.pop("logprobs", None)
                if release:
                    kept["content"] = release
                    if choice.logprobs and "logprobs" not in shown:
                        shown["logprobs"] = {"content": choice.logprobs, "refusal": None}
                        choice.logprobs = []
            elif "content" in delta:
                kept["content"] = text
            for call in delta.get("tool_calls") or ():
                if isinstance(call, Mapping):
                    self._call_delta(choice, call)
                untouched = False
            if item.get("finish_reason") is not None:
                untouched = False
                choice.finish = {k: v for k, v in item.items() if k not in ("delta", "logprobs")}
                choice.usage, usage = usage, None  # the finish is sent later: its usage with it
                self._finished.append(at)
            if kept:
                out.append({**shown, "delta": kept, "finish_reason": None})
        if untouched:
            return [raw]
        if not out:
            return []
        return [event({**self.template, "choices": out, **({"usage": usage} if usage is not None else {})})]

    # --- out ---

    def finished(self) -> list[int]:
        done, self._finished = self._finished, []
        return done

    def look(self, at: int) -> Look:
        choice = self.choices[at]
        return look(choice.content(), choice.tool_calls() or None, self.index, self.text_calls)

    def original(self, at: int) -> dict[str, Any]:
        choice = self.choices[at]
        return {"role": "assistant", "content": choice.content(), "tool_calls": choice.tool_calls() or None}

    def close(self, at: int, revised: Revised | None, extension: Mapping[str, Any] | None = None) -> list[bytes]:
        """The rest of one choice: its held text or calls (as revised, when `revised` changed them), then its
        finish, with `extension` beside it."""
        choice = self.choices[at]
        choice.closed = True
        out: list[bytes] = []
        calls = choice.tool_calls()
        text = choice.pending + choice.held
        from_text = revised is not None and revised.outcome == REVISED and not calls
        if revised is not None and revised.changed:
            calls = revised.tool_calls or []
        if text and not from_text:
            logprobs = {"logprobs": {"content": choice.logprobs, "refusal": None}} if choice.logprobs else {}
            out.append(self._chunk(at, {"content": text}, logprobs))
        for k, call in enumerate(calls):
            out.append(self._chunk(at, {"tool_calls": [{"index": k, **call}]}))
        finish = dict(choice.finish or {"index": at, "finish_reason": "stop"})
        if from_text:
            finish["finish_reason"] = "tool_calls"
        if extension:
            finish["tracemill"] = dict(extension)
        usage = {"usage": choice.usage} if choice.usage is not None else {}
        out.append(event({**self.template, "choices": [{**finish, "delta": {}}], **usage}))
        return out

    def _chunk(self, at: int, delta: dict[str, Any], extra: Mapping[str, Any] | None = None) -> bytes:
        return event({**self.template, "choices": [{"index": at, "delta": delta, **(extra or {}),
                                                    "finish_reason": None}]})

    def unfinished(self) -> list[int]:
        """Choices not closed yet: at the end of the stream, those the upstream never finished."""
        return [at for at, c in self.choices.items() if not c.closed and at not in self._finished]
