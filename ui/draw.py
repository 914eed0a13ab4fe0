"""Pieces the pages draw with: a call as JSON with its violations pointed at, diffs, verdict badges, the span
waterfall. Everything shown from the store is escaped: model output is untrusted text."""

from __future__ import annotations

import difflib
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracemill.spans import SpanRecord
from tracemill.store.queries import StoredCall


def _key(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True, slots=True)
class _Line:
    text: str
    pointer: str


def _lines(value: Any, pointer: str, indent: int, prefix: str, comma: bool, out: list[_Line]) -> None:
    pad, tail = "  " * indent, "," if comma else ""
    if isinstance(value, dict) and value:
        out.append(_Line(f"{pad}{prefix}{{", pointer))
        items = list(value.items())
        for i, (k, v) in enumerate(items):
            _lines(v, f"{pointer}/{_key(str(k))}", indent + 1, json.dumps(str(k)) + ": ", i < len(items) - 1, out)
        out.append(_Line(f"{pad}}}{tail}", pointer))
    elif isinstance(value, list) and value:
        out.append(_Line(f"{pad}{prefix}[", pointer))
        for i, v in enumerate(value):
            _lines(v, f"{pointer}/{i}", indent + 1, "", i < len(value) - 1, out)
        out.append(_Line(f"{pad}]{tail}", pointer))
    else:
        out.append(_Line(f"{pad}{prefix}{json.dumps(value, ensure_ascii=False)}{tail}", pointer))


def pointed_json(value: Any, violations: Sequence[dict[str, Any]]) -> str:
    """HTML of `value` as indented JSON, each line a violation points at highlighted with its message; a pointer to
    a key that is not there (a missing parameter) gets a line of its own where the key belongs."""
    lines: list[_Line] = []
    _lines(value, "", 0, "", False, lines)
    messages: dict[str, list[str]] = {}
    for v in violations:
        messages.setdefault(str(v.get("pointer") or ""), []).append(str(v.get("message") or v.get("kind") or ""))
    present = {line.pointer for line in lines}
    shown: set[str] = set()
    out: list[str] = []
    for i, line in enumerate(lines):
        text = html.escape(line.text)
        why = messages.get(line.pointer)
        if why and line.pointer not in shown and line.pointer:
            shown.add(line.pointer)
            out.append(f'<span class="hl">{text}<span class="why">⟵ {html.escape("; ".join(why))}</span></span>')
        else:
            out.append(text)
        opening = line.text.rstrip().endswith(("{", "["))
        if opening:
            for missing, why_missing in messages.items():
                parent, _, name = missing.rpartition("/")
                if missing not in present and parent == line.pointer and missing:
                    pad = " " * (len(line.text) - len(line.text.lstrip(" ")) + 2)
                    out.append(f'<span class="hl"><span class="missing">{pad}{html.escape(json.dumps(name))}: '
                               f'(missing)</span><span class="why">⟵ {html.escape("; ".join(why_missing))}'
                               f"</span></span>")
    return '<pre class="tm-json">' + "\n".join(out) + "</pre>"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def diff(before: Any, after: Any, before_name: str = "as emitted", after_name: str = "revised") -> str:
    """A unified diff of two values as indented JSON (text as is)."""
    a = before if isinstance(before, str) else pretty(before)
    b = after if isinstance(after, str) else pretty(after)
    return "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), before_name, after_name, lineterm="", n=3))


def verdict_badge(call: StoredCall) -> str:
    if call.stage is not None:
        return f'<span class="tm-badge tm-fail">{html.escape(call.stage)} failed</span>'
    if call.execution_status == "error":
        return '<span class="tm-badge tm-fail">execution failed</span>'
    if call.name_valid is None:
        return '<span class="tm-badge tm-muted">tools not known</span>'
    return '<span class="tm-badge tm-ok">valid</span>'


def badge(text: str, kind: str = "muted") -> str:
    return f'<span class="tm-badge tm-{kind}">{html.escape(text)}</span>'


@dataclass(frozen=True, slots=True)
class TreeRow:
    span: SpanRecord
    depth: int

    @property
    def label(self) -> str:
        return ("\u2003" * self.depth) + ("└ " if self.depth else "") + self.span.name


def span_tree(spans: Sequence[SpanRecord]) -> list[TreeRow]:
    """Spans in tree order (children after their parent, by start time); a span whose parent is not stored is a
    root."""
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[SpanRecord]] = {}
    for s in sorted(spans, key=lambda s: (s.start_time_ns, s.span_id)):
        parent = s.parent_span_id if s.parent_span_id in ids else None
        children.setdefault(parent, []).append(s)
    out: list[TreeRow] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in children.get(parent, []):
            out.append(TreeRow(s, depth))
            walk(s.span_id, depth + 1)

    walk(None, 0)
    return out


def waterfall(rows: Sequence[TreeRow], failed_spans: set[str]):  # type: ignore[no-untyped-def]
    """The trace's spans as bars on a time axis (ms from the trace's start), in tree order."""
    import altair as alt
    import pandas as pd

    start = min(r.span.start_time_ns for r in rows)
    data = pd.DataFrame([{
        "order": i, "span": f"{i + 1:>2}. {r.label}", "start": (r.span.start_time_ns - start) / 1e6,
        "end": max(r.span.end_time_ns, r.span.start_time_ns + 1) / 1e6 - start / 1e6,
        "ms": round((r.span.end_time_ns - r.span.start_time_ns) / 1e6, 1),
        "kind": _kind(r.span, failed_spans)} for i, r in enumerate(rows)])
    colors = alt.Scale(domain=["agent", "model", "tool", "failed", "other"],
                       range=["#6b7a99", "#3b6fd8", "#2f9e6f", "#d92d20", "#a0aec0"])
    return (alt.Chart(data).mark_bar(cornerRadius=2, height=14)
            .encode(x=alt.X("start:Q", title="ms since the trace started"), x2="end:Q",
                    y=alt.Y("span:N", sort=alt.SortField("order"), title=None, axis=alt.Axis(labelLimit=420)),
                    color=alt.Color("kind:N", scale=colors, legend=alt.Legend(orient="top", title=None)),
                    tooltip=["span", "ms", "kind"])
            .properties(height=alt.Step(24)))


def _kind(span: SpanRecord, failed_spans: set[str]) -> str:
    if span.span_id in failed_spans or span.status_code == 2:
        return "failed"
    operation = str(span.attributes.get("gen_ai.operation.name") or "")
    if operation in ("chat", "text_completion", "generate_content"):
        return "model"
    if operation == "execute_tool" or span.name.startswith(("tools/call", "execute_tool")):
        return "tool"
    if operation in ("invoke_agent", "create_agent"):
        return "agent"
    return "other"
