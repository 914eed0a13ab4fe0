import json
import random
from collections import Counter

import pytest

from tracemill.bfcl import load_bfcl
from tracemill.faults import CONTEXT_KINDS, KINDS, PROFILES, TEXT_KINDS, corrupt, corrupt_calls, sample_faults
from tracemill.tools import load_mcp_bench, name_key, tool_index
from tracemill.verify import ToolCall, parse_call, verify

CASES = load_bfcl()
SERVERS = load_mcp_bench()


def _corrupt_case(case, kinds, seed):
    return corrupt_calls(case.reference(), case.tools, kinds, random.Random(seed))


def _single_call_cases():
    return [c for c in CASES if len(c.answers) == 1]


def test_same_seed_same_outputs_on_real_schemas():
    def run(seed):
        rng = random.Random(seed)
        out = []
        for case in CASES[:150]:
            kinds = sample_faults("llama3.1-8b", rng, n_calls=len(case.answers))
            out.append(corrupt_calls(case.reference(), case.tools, kinds, rng))
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_clean_profile_emits_the_reference_as_a_valid_native_call():
    rng = random.Random(0)
    for case in _single_call_cases():
        kinds = sample_faults("clean", rng)
        assert kinds == []
        call = case.reference()[0]
        out = corrupt(call, next(t for t in case.tools if t.name == call.name), case.tools, kinds, rng)
        assert out.native and out.faults == ()
        verdict = verify(out.raw, case.tools)
        assert verdict.ok and verdict.call == call


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "extra_param"])
def test_every_fault_breaks_the_call_on_bfcl(kind):
    applied = 0
    for i, case in enumerate(_single_call_cases()):
        out = _corrupt_case(case, [kind], i)
        if not out.faults:
            continue
        applied += 1
        if applied > 120:
            break
        assert out.kinds == (kind,)
        assert out.native == (kind not in TEXT_KINDS)
        assert not verify(out.raw, case.tools).ok, out.raw
    assert applied >= 5


def test_extra_parameter_is_recoverable_only_where_the_schema_forbids_it():
    case = _single_call_cases()[0]
    strict = _corrupt_case(case, ["extra_param"], 0)
    assert strict.faults[0].recoverable and not verify(strict.raw, case.tools).ok
    server = SERVERS["Weather Data"]
    tool = next(t for t in server if t.input_schema.get("additionalProperties") is not False
                and t.input_schema.get("required"))
    call = ToolCall(tool.name, {p: "Paris" for p in tool.input_schema["required"]})
    assert verify(call, server).ok
    loose = corrupt(call, tool, server, ["extra_param"], random.Random(0))
    assert not loose.faults[0].recoverable and verify(loose.raw, server).ok


def test_lost_information_is_marked_unrecoverable():
    for i, case in enumerate(_single_call_cases()[:60]):
        for kind in ("missing_required", "truncated"):
            out = _corrupt_case(case, [kind], i)
            assert all(not f.recoverable for f in out.faults)
            assert not out.recoverable or not out.faults


def test_truncation_cuts_the_output_inside_a_value():
    for i, case in enumerate(_single_call_cases()[:100]):
        clean, cut = _corrupt_case(case, [], i).raw, _corrupt_case(case, ["truncated"], i).raw
        assert clean.startswith(cut) and len(cut) < len(clean)
        assert not cut.endswith(("}", "]"))


def test_dropping_a_shared_server_prefix_is_not_recoverable():
    tools = [t for ts in SERVERS.values() for t in ts]
    shared = [t for t in tools if t.name.endswith(":search")]
    assert len(shared) == 2
    out = corrupt(ToolCall(shared[0].name, {}), shared[0], tools, ["tool_name_prefix"], random.Random(0))
    assert parse_call(out.raw).name == "search"
    assert not out.faults[0].recoverable
    unique = SERVERS["Weather Data"][0]
    out = corrupt(ToolCall(unique.name, {}), unique, tools, ["tool_name_prefix"], random.Random(0))
    assert out.faults[0].recoverable and parse_call(out.raw).name == unique.name.split(":")[1]


def test_name_faults_stay_close_to_the_intended_tool_on_mcp_bench():
    tools = tool_index(t for ts in SERVERS.values() for t in ts)
    rng = random.Random(1)
    for tool in list(tools.values())[:80]:
        for kind in ("tool_name_case", "tool_name_separator"):
            out = corrupt(ToolCall(tool.name, {}), tool, list(tools.values()), [kind], rng)
            if out.faults:
                name = parse_call(out.raw).name
                assert name not in tools and name_key(name) == name_key(tool.name)


def test_two_calls_concatenated_read_as_extra_data():
    case = next(c for c in CASES if len(c.answers) == 2)
    out = _corrupt_case(case, ["concatenated"], 0)
    assert not out.native
    verdict = verify(out.raw, case.tools)
    assert "Extra data" in verdict.violations[0].message


def test_profile_rates_are_the_sampled_rates():
    rng = random.Random(42)
    n = 20000
    counts = Counter(k for _ in range(n) for k in sample_faults("llama3.1-8b", rng))
    for kind in ("python_tag", "number_as_string", "missing_required", "prose"):
        rate = PROFILES["llama3.1-8b"].rates[kind]
        assert abs(counts[kind] / n - rate) < 4 * (rate * (1 - rate) / n) ** 0.5 + 1e-9


def test_single_intended_call_is_never_concatenated():
    rng = random.Random(3)
    profile = PROFILES["llama3.1-8b"]
    assert not any("concatenated" in sample_faults(profile, rng, n_calls=1) for _ in range(3000))


def test_unknown_names_are_refused_by_name():
    with pytest.raises(ValueError, match="llama-9"):
        sample_faults("llama-9", random.Random(0))
    case = CASES[0]
    with pytest.raises(ValueError, match="bogus"):
        _corrupt_case(case, ["bogus"], 0)


def _single_call_items():
    from tracemill.suites import _mcp_calls

    return [(c.tools, c.reference()) for c in _single_call_cases()] + [(t, [call]) for _, t, call in _mcp_calls()]


@pytest.mark.parametrize("kind", sorted(CONTEXT_KINDS))
def test_context_faults_break_the_call_and_the_rules_never_guess(kind):
    from tracemill.repair import revise

    applied = 0
    for i, (tools, reference) in enumerate(_single_call_items()):
        out = corrupt_calls(reference, tools, [kind], random.Random(i))
        if not out.faults:
            continue
        applied += 1
        fault = out.faults[0]
        assert fault.context and not fault.recoverable and out.context_recoverable and not out.recoverable
        index = tool_index(tools)
        assert not verify(out.raw, index).ok, out.raw
        assert not revise(out.raw, index, [{"role": "user", "content": fault.hint}]).ok, out.raw
    assert applied >= 50


def test_context_hints_say_what_the_output_lost():
    seen = Counter()
    for i, (tools, reference) in enumerate(_single_call_items()):
        intended = reference[0].arguments
        for kind in ("omitted_value", "swapped_args"):
            out = corrupt_calls(reference, tools, [kind], random.Random(i))
            if not out.faults:
                continue
            seen[kind] += 1
            lost = [p for p in intended if parse_call(out.raw).arguments.get(p) != intended[p]]
            assert lost and all(str(intended[p]) in out.hints[0] or json.dumps(intended[p]) in out.hints[0]
                                for p in lost), (out.hints, lost)
    assert seen["omitted_value"] > 100 and seen["swapped_args"] > 50
