"""The reviser's prompt (`tracemill.reviser_prompt`): which tools it shows, and the miner's digest of it.

The ranking is checked against a plain statement of it (below, `_ranked_plainly`): the caches, bounds and memos that
make `build_prompt` cheap must never change which tools a model is shown."""

import base64
import itertools
import json
import random

import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracemill.miner.part import prompt_digest
from tracemill.names import match_tool, similarity
from tracemill.reader import read
from tracemill.reviser_prompt import PromptSettings, build_prompt, conversation, nearest_tools
from tracemill.tools import base_key, load_mcp_bench, name_key, tool_index

SERVERS = load_mcp_bench()
# toolsets as agents are given them: one server's tools, or two servers' together
TOOLSETS = [tool_index(tools) for tools in SERVERS.values()] + [
    tool_index(SERVERS[a] + SERVERS[b]) for a, b in zip(sorted(SERVERS)[::2], sorted(SERVERS)[1::2], strict=False)]


def _ranked_plainly(raw: str, index, request: str, k: int) -> list[str]:
    """The tools a prompt shows, stated plainly: the ones the output names (near misses resolved), then the rest by
    their best name score against the output's names plus half the share of their words that the output or the
    request holds, the best first, ties by name."""
    from tracemill.reviser_prompt import _IDENTIFIERS, _words

    names = [c.name for c in read(raw, index).calls if isinstance(c.name, str) and c.name]
    if not names:
        names = [w for w in _IDENTIFIERS.findall(raw) if len(w) > 3][:20]
    shown: list[str] = []
    for name in names:
        hit = name if name in index else (match_tool(name, dict.fromkeys(index)) or (None,))[0]
        if hit is not None and len(shown) < k and hit not in shown:
            shown.append(hit)
    said = _words(raw) | _words(request)

    def score(tool) -> float:
        by_name = max((max(similarity(name_key(n), name_key(tool.name)), similarity(base_key(n), base_key(tool.name)))
                       for n in names), default=0.0)
        about = _words(f"{tool.name} {tool.description}")
        return by_name + 0.5 * (len(about & said) / len(about) if about else 0.0)

    rest = sorted((-score(t), t.name) for t in index.values() if t.name not in shown)
    return shown + [name for _, name in rest[:k - len(shown)]]


def _outputs(rng: random.Random, index) -> list[tuple[str, str]]:
    """(output, request) pairs as weak models write them: a call with a right, near or wrong name, prose naming a
    tool, words of a description, nothing a tool knows."""
    tools = list(index.values())
    found = []
    for _ in range(12):
        tool = rng.choice(tools)
        other = rng.choice(tools)
        short = tool.name.split(":")[-1]
        words = " ".join(rng.sample(tool.description.split(), min(4, len(tool.description.split()))))
        found += [
            (json.dumps({"name": tool.name, "arguments": {}}), ""),
            (json.dumps({"name": short.replace("_", ""), "arguments": {"q": words}}), other.description[:80]),
            (f"I will call {short} now.", f"please {words}"),
            (f"```json\n{{\"name\": \"{short}_v2\", \"arguments\": {{}}}}\n```", ""),
            (words, other.name),
            ("Sure, here you go.", "what is the weather like"),
        ]
    return found


def test_the_tools_shown_are_the_ones_named_then_the_closest_by_name_and_words():
    rng = random.Random(7)
    checked = 0
    for index in TOOLSETS:
        for k in (1, 4):
            for raw, request in _outputs(rng, index):
                want = _ranked_plainly(raw, index, request, k)
                assert [t.name for t in nearest_tools(raw, index, request, k)] == want, (raw, request)
                # asked again (the ranking is remembered): the same tools
                assert [t.name for t in nearest_tools(raw, index, request, k)] == want
                checked += 1
    assert checked > 1000


def test_a_prompt_shows_its_tools_in_the_order_ranked_and_the_request_it_answered():
    index = TOOLSETS[0]
    tool = next(iter(index.values()))
    raw = json.dumps({"name": tool.name, "arguments": {"x": 1}})
    context = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Look it up, please."}]
    prompt = build_prompt(raw, index, context, PromptSettings(max_tools=3))
    user = prompt.messages[-1]["content"]
    shown = [json.loads(line)["name"] for line in user.split("<tools>\n")[1].split("\n</tools>")[0].split("\n")]
    assert shown == [t.name for t in prompt.tools] == _ranked_plainly(raw, index, "Look it up, please.", 3)
    assert "user: Look it up, please." in user and "You are an agent." not in user
    assert user.endswith(f"<output>\n{raw}\n</output>")
    assert "\n".join(prompt.sections) == user
    assert json.loads(prompt.tools_json) == [t.to_mcp() for t in prompt.tools]  # the dataset's `tools` column


_SPACE = st.sampled_from([" ", "  ", "\n", "\t", " \n ", "\n\n", "\u00a0", "\r\n"])


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(st.text(st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1,
                              max_size=8), min_size=1, max_size=12),
       gaps=st.lists(_SPACE, min_size=13, max_size=13), system=st.booleans())
def test_the_digest_is_of_the_prompt_with_each_run_of_whitespace_made_one_space(words, gaps, system):
    index = TOOLSETS[0]
    text = "".join(g + w for g, w in zip(gaps, words, strict=False))
    context = [{"role": "user", "content": text + gaps[-1]}, {"role": "assistant", "content": gaps[0] + text}]
    prompt = build_prompt(text, index, context, PromptSettings(system=system))
    whole = "\x1e".join(f"{m['role']}\x1f{' '.join(m['content'].split())}" for m in prompt.messages)
    assert prompt_digest(prompt) == xxhash.xxh3_128_hexdigest(whole.encode())


def _turns_plainly(context: list[dict[str, str]], budget: int) -> list[str]:
    """The turns a prompt shows, stated plainly: every turn but the system's read, the user's last request kept (cut
    to the budget where it alone is over it), then the others from the newest back while they fit."""
    shown = [m for m in context if m["role"] != "system" and m["content"]]
    lines = [f"{m['role']}: {m['content']}" for m in shown]
    requests = [i for i, m in enumerate(shown) if m["role"] == "user"]
    kept, used = {}, 0
    if requests:
        line = lines[requests[-1]]
        if len(line) // 4 + 1 > budget:
            line = line[: max(1, len(line) * budget // (len(line) // 4 + 1))]
        kept[requests[-1]], used = line, len(line) // 4 + 1
    for i in reversed(range(len(lines))):
        if i in kept:
            continue
        if used + len(lines[i]) // 4 + 1 > budget:
            break
        kept[i], used = lines[i], used + len(lines[i]) // 4 + 1
    return [kept[i] for i in sorted(kept)]


def test_a_conversation_keeps_the_user_s_last_request_and_the_newest_turns_that_fit_its_budget():
    texts = ["", "ok", "find the paper 2101.00001", "y" * 400]
    turns = [{"role": role, "content": text} for role in ("system", "user", "tool") for text in texts]
    checked = 0
    for length in range(5):
        for context in itertools.product(turns, repeat=length):
            for budget in (1, 12, 120):
                assert conversation(list(context), budget) == _turns_plainly(list(context), budget), (context, budget)
                checked += 1
    assert checked > 60_000


_MANY = max(TOOLSETS, key=len)
_ASKS = ["", *(tool.description for tool in list(_MANY.values())[::13])]  # requests in a tool's words


@settings(max_examples=100)
@given(turns=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), st.sampled_from(_ASKS)), max_size=8))
def test_a_prompt_shows_the_turns_kept_and_ranks_tools_by_the_user_s_last_request(turns):
    index = _MANY
    context = [{"role": role, "content": text} for role, text in turns]
    prompt = build_prompt("Sure, here you go.", index, context, PromptSettings(max_tools=2, budget_tokens=40))
    user = prompt.messages[-1]["content"]
    kept = conversation(context, 40)
    assert ("<conversation>\n" + "\n".join(kept) + "\n</conversation>" in user) == bool(kept)
    requests = [text for role, text in turns if role == "user"]
    assert prompt.tools == tuple(nearest_tools("Sure, here you go.", index, requests[-1] if requests else "", 2))


def test_an_image_in_the_conversation_is_shown_as_its_kind_never_as_its_bytes():
    """A vision agent resends its screenshots with every turn: their base64 would fill the prompt's budget with noise
    that no reviser can read. Each convention's media part shows as what it is."""
    data = base64.b64encode(random.Random(0).randbytes(150_000)).decode()
    media = [{"type": "blob", "modality": "image", "mime_type": "image/png", "content": data},  # GenAI
             {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},  # OpenAI
             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]  # Anthropic
    for part in media:
        context = [{"role": "user", "content": [{"type": "text", "text": "Which tool opens this chart?"}, part]},
                   {"role": "tool", "parts": [part]}]
        turns = conversation(context, 2000)
        assert turns == ["user: Which tool opens this chart? [image]", "tool: [image]"], part["type"]
