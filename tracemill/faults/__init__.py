"""The seeded fault library: how a weak open model breaks a tool call, at per-profile rates.

One library for `tracemill simulate` and for `tracemill eval`'s `bfcl` suite.

    rng = random.Random(seed)
    kinds = sample_faults("llama3.1-8b", rng)             # e.g. ["number_as_string", "python_tag"]
    kinds = sample_faults("llama3.1-8b", rng, n_calls=1)  # the output is meant to hold one call
    bad = corrupt(call, tool, tools, kinds, rng)          # Corrupted(raw, native, faults)
    bad = corrupt_calls([c1, c2], tools, kinds, rng)      # several calls in one output

`Corrupted.native` is True when `raw` is a native tool call's JSON, `{"name", "arguments"}` with `arguments` a JSON
string as the OpenAI API sends it (or a JSON array of such calls), and False when `raw` is assistant text content that
holds the call(s). A call is native unless a text-only fault (`TEXT_KINDS`) was applied. Without faults, `raw` is a
valid native call (for several calls, a JSON array of valid native calls).

`Corrupted.faults` lists the faults actually applied, in `KINDS` order; a kind that does not apply to the call (e.g.
`enum_case` on a tool without enums, `missing_required` on one without required parameters) is skipped and not
listed. `Fault.recoverable` says whether the intended call can still be read from the output: a near-miss tool name
is recoverable when no other offered tool shares its folded form (`tools.name_key`, or its base name for server
prefixes); a near-miss parameter name likewise among the parameters, and only when the call is invalid without it
(the schema forbids unknown parameters or the parameter is required; otherwise the call is valid as sent); an unknown
extra parameter when the schema forbids unknown parameters; `missing_required` and `truncated` (cut mid-value) never
are. The context kinds (`CONTEXT_KINDS`: a required value left out that the request states, a synonym parameter name,
two values swapped, a value in the wrong format, the right server's wrong tool) are never recoverable by rules;
`Fault.context` marks them recoverable from the conversation, and `Corrupted.hints` is what the user's request must say
for that (the simulator and the eval suites put it there). `Corrupted.context_recoverable`: rules cannot recover the
output, a reviser reading the conversation can.

Everything is deterministic for a given `random.Random` state; nothing here reads the clock or global randomness.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tracemill.faults.content import CONTENT_FAULTS, Target, properties
from tracemill.faults.kinds import CONTENT_KINDS, CONTEXT_KINDS, KINDS, RENDER_KINDS, TEXT_KINDS, Corrupted, Fault
from tracemill.faults.profiles import PROFILES, WEAK_PROFILES, Profile, sample_faults
from tracemill.faults.render import RenderCall, render
from tracemill.tools import Tool
from tracemill.verify import ToolCall

__all__ = ["CONTENT_KINDS", "CONTEXT_KINDS", "KINDS", "PROFILES", "RENDER_KINDS", "TEXT_KINDS", "WEAK_PROFILES",
           "Corrupted", "Fault", "Profile", "corrupt", "corrupt_calls", "sample_faults"]


def corrupt_calls(calls: Sequence[ToolCall], tools: Sequence[Tool], kinds: Sequence[str],
                  rng: random.Random) -> Corrupted:
    """Write `calls` (each naming one of `tools`) as a model with the given fault kinds would. Content faults hit one
    call drawn at random; `concatenated` with a single call writes it twice."""
    index = {t.name: t for t in tools}
    strangers = [c.name for c in calls if c.name not in index]
    if strangers:
        raise ValueError(f"calls name tools that were not offered: {', '.join(strangers)}")
    work = [RenderCall(c.name, dict(c.arguments), index[c.name]) for c in calls]
    wanted = set(kinds)
    unknown = wanted - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kind(s): {', '.join(sorted(unknown))}")
    names = [t.name for t in tools]
    faults: list[Fault] = []
    for kind in CONTENT_KINDS:
        if kind in wanted and work:
            target = rng.choice(work)
            done = CONTENT_FAULTS[kind](
                Target(target.name, target.args, target.tool, names, properties(target.tool), index), rng)
            if done is not None:
                target.name, target.args, fault = done
                faults.append(fault)
    applied = {k for k in RENDER_KINDS if k in wanted}
    if "concatenated" in applied and len(work) == 1:
        work = [work[0], RenderCall(work[0].name, dict(work[0].args), work[0].tool)]
    native = not (applied & TEXT_KINDS)
    if native and work and not work[-1].args:
        applied.discard("missing_brace")  # "{" alone would read as cut short, not as a missing brace
    raw, detail = render(work, applied, native, rng)
    for kind in RENDER_KINDS:
        if kind in applied:
            faults.append(Fault(kind, kind != "truncated", detail.get(kind, "")))
    return Corrupted(raw=raw, native=native, faults=tuple(faults))


def corrupt(call: ToolCall, tool: Tool, tools: Sequence[Tool], kinds: Sequence[str],
            rng: random.Random) -> Corrupted:
    """Write one call to `tool` (one of `tools`, the tools the model was offered) with the given fault kinds."""
    if tool.name not in {t.name for t in tools}:
        tools = [*tools, tool]
    return corrupt_calls([call], tools, kinds, rng)
