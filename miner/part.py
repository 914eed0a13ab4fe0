"""One share of a `tracemill mine` run: the traces whose last call's id falls in a range, read trace by trace, turned
into rows and written to part files (`part-K-SPLIT.jsonl`, its Parquet, and a `.meta` line per row: its prompt
digest, a hash and the length of its line, and the values the card counts). Of two rows of a split with the same
prompt, a part keeps only the first; `tracemill.miner.export` runs the shares in worker processes and merges their
files in order, dropping what repeats a row of an earlier part or split, so that any number of workers writes the
same export."""

from __future__ import annotations

import gc
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path
from typing import Any

import orjson
import xxhash
from sqlalchemy import Engine, func, select

from tracemill.collector.joins import stored_events
from tracemill.miner.conversation import (
    GENAI_MESSAGES,
    Conversation,
    event_messages,
    genai_conversation,
    is_conversation,
    span_messages,
)
from tracemill.miner.parquet import RowWriter
from tracemill.miner.repairs import find_repairs
from tracemill.miner.rows import build_row, reference_for
from tracemill.reader import Reading, read
from tracemill.reviser_prompt import PromptSettings, ReviserPrompt, build_prompt
from tracemill.short_cache import cache_short
from tracemill.store.payloads import PARTS_KEY, REF_KEY, assemble, bodies_of, digests, is_reference, resolve_all
from tracemill.store.queries import CallFilter, StoredCall, by_span_keys, iter_traces, toolsets, trace_starts
from tracemill.store.tables import PayloadRow, ReviewRow, SpanRow
from tracemill.tools import Tool, tool_index

SPLITS = ("train", "eval")


@dataclass(frozen=True, slots=True)
class PartOptions:
    where: CallFilter
    eval_after: datetime | None
    eval_share: float
    valid_rate: float  # of the valid calls, the share sampled
    seed: int
    prompt: PromptSettings
    batch: int


@dataclass(slots=True)
class PartResult:
    stats: Counter[str] = field(default_factory=Counter)
    links: dict[int, int] = field(default_factory=dict)  # repair call id -> the failed call it repaired


def unit(seed: int, what: str, key: str) -> float:
    """A number in [0, 1) fixed by the seed and the key: sampling and splitting that re-runs alike."""
    digest = hashlib.blake2b(f"{seed}:{what}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@cache_short(limit=2048, maxsize=4096)  # a longer piece (a large output, seldom repeated) is not kept
def _squeezed(text: str) -> str:
    return " ".join(text.split())


def _normalised(pieces: Iterable[str]) -> str:
    """The pieces joined by newlines, with every run of whitespace made one space, each piece normalised alone: the
    tool lines of a toolset and the turns that a trace's calls share are normalised once."""
    return " ".join(filter(None, map(_squeezed, pieces)))


def prompt_digest(prompt: ReviserPrompt) -> str:
    """The row's normalised content: its prompt with runs of whitespace made one space (the last message read from
    its sections, whose tool lines are the same strings row after row)."""
    *before, last = prompt.messages
    pieces = [(m["role"], m["content"].split("\n")) for m in before] + [(last["role"], prompt.sections)]
    text = "\x1e".join(f"{role}\x1f{_normalised(lines)}" for role, lines in pieces)
    return xxhash.xxh3_128_hexdigest(text.encode())


def part_files(folder: Path, part: int, split: str) -> tuple[Path, Path, Path]:
    """A part's JSON Lines, `.meta` lines and Parquet file for a split."""
    stem = folder / f"part-{part}-{split}"
    return stem.with_suffix(".jsonl"), stem.with_suffix(".meta"), stem.with_suffix(".parquet")


class PartFiles:
    """A part's JSON Lines, `.meta` lines and Parquet file for each split, written row by row; a row whose prompt an
    earlier row of the split had is left out."""

    def __init__(self, folder: Path, part: int) -> None:
        self.folder = folder
        self.lines = {}
        self.parquet = {}
        self.seen: dict[str, set[str]] = {split: set() for split in SPLITS}
        for split in SPLITS:
            lines, meta, parquet = part_files(folder, part, split)
            # a row is a line of about 9 KB: with the default 8 KB buffer each was its own write(2). The files
            # outlive this call: `close_lines` closes them
            self.lines[split] = (open(lines, "wb", buffering=1 << 20), open(meta, "wb"))  # noqa: SIM115
            self.parquet[split] = RowWriter(parquet)

    def write(self, split: str, row: dict[str, Any], key: str) -> bool:
        """Whether the row was written (False: a duplicate; `key`: its prompt's digest)."""
        if key in self.seen[split]:
            return False
        self.seen[split].add(key)
        lines, meta = self.lines[split]
        line = orjson.dumps(row) + b"\n"
        lines.write(line)
        counted = (row["failure_class"], row["provenance"], row["model"], row["harness_version"])
        meta.write(orjson.dumps([key, xxhash.xxh3_128_hexdigest(line), len(line), *counted]) + b"\n")
        self.parquet[split].add(row, len(line))
        return True

    def close_lines(self) -> None:
        """The JSON Lines and `.meta` files complete; the Parquet writers stay open (the first part's take the later
        parts' rows)."""
        for lines, meta in self.lines.values():
            lines.close()
            meta.close()

    def close(self) -> None:
        self.close_lines()
        for parquet in self.parquet.values():
            parquet.close()


class _Tools:
    """Tool indexes by toolset id, read once each."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.indexes: dict[int, dict[str, Tool]] = {}

    def for_calls(self, calls: Iterable[StoredCall]) -> dict[int, dict[str, Tool]]:
        wanted = {c.toolset_id for c in calls if c.toolset_id is not None} - set(self.indexes)
        if wanted:
            with self.engine.connect() as conn:
                for toolset_id, tools in toolsets(conn, wanted).items():
                    self.indexes[toolset_id] = tool_index(tools)
        return self.indexes


def _contexts(engine: Engine, calls: list[StoredCall]) -> dict[tuple[str, str], Conversation]:
    """The conversation of each call's span (`miner.conversation`), `_Conversations.MOST` calls at most, each lookup one
    statement; of the values stored once, only the conversations are read."""
    keys = list(dict.fromkeys((c.trace_id, c.span_id) for c in sorted(calls, key=attrgetter("id"))))  # the order stored
    with engine.connect() as conn:
        found, cut = {}, {}
        for r in by_span_keys(conn, _GENAI_CONVERSATION, keys):
            if r.messages is None:
                continue
            if (parts := _parts_reference(r.messages)) is not None:
                cut[(r.trace_id, r.span_id)] = parts
            else:
                found[(r.trace_id, r.span_id)] = genai_conversation(r.messages)
        if cut:  # stored in parts that the calls of a run share: each read once
            bodies = bodies_of(conn, (key for ref in cut.values() for key in digests(ref)))
            found.update((key, genai_conversation(text)) for key, ref in cut.items()
                         if (text := assemble(ref, bodies)) is not None)
        others = set(keys) - found.keys()
        if others:  # another convention: read the span's attributes
            rows = by_span_keys(conn, select(SpanRow.trace_id, SpanRow.span_id, SpanRow.attributes), sorted(others))
            said = {(r.trace_id, r.span_id): {k: v for k, v in (r.attributes or {}).items() if is_conversation(k)}
                    for r in rows}
            found.update((key, _encoded(span_messages(a))) for key, a in resolve_all(conn, said).items())
        unsaid = {key for key in keys if key not in found or not found[key].messages}
        if unsaid:  # the messages may have come as the span's log events
            found.update((key, _encoded(event_messages(said))) for key, said in stored_events(conn, unsaid).items())
    return found


def _encoded(messages: list[Any]) -> Conversation:
    """Messages read from another convention than GenAI's, with their JSON (its length is what `_Conversations`
    counts, and a span's calls share it)."""
    return Conversation(messages, orjson.dumps(messages, default=str).decode())


_UNSAID = Conversation()  # a span that holds no conversation
_UNREAD = ("execution_result",)  # no row holds a tool's result: up to 64 K characters each, 2,000 calls a batch
_Chosen = tuple[str, StoredCall, tuple[StoredCall, ...] | None]  # a row to make: its split, its call, its repair


class _Conversations:
    """The conversations of chosen calls, read a slice of calls at a time and let go when the slice is done. A slice
    holds about `CHARS` characters of conversation at most: real agent contexts reach hundreds of KB each, and a
    batch's all at once came to gigabytes. The slice size carries over from batch to batch, doubling while the slices
    read stay under half of `CHARS` (a query for every few calls costs time where conversations are short)."""

    CHARS = 4 << 20
    FIRST, MOST = 64, 500  # MOST: the keys one lookup statement binds

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.calls = self.FIRST

    def along(self, chosen: list[_Chosen]) -> Iterator[tuple[_Chosen, Conversation]]:
        start = 0
        while start < len(chosen):
            part = chosen[start:start + self.calls]
            start += len(part)
            found = _contexts(self.engine, [call for _, call, _ in part])
            for item in part:
                yield item, found.get((item[1].trace_id, item[1].span_id), _UNSAID)
            chars = sum(len(c.text) for c in found.values() if c.text is not None)
            self.calls = max(1, min(self.MOST, 2 * self.calls, len(part) * self.CHARS // max(chars, 1)))


# The GenAI conversation, extracted by the database as the text it was sent as, the stored-once text in its place
# (decoding whole attributes, or having the database quote the text as JSON and decoding that, costs more); for a
# conversation stored in parts, the reference to them (`_parts_reference`)
_GENAI_CONVERSATION = select(SpanRow.trace_id, SpanRow.span_id, func.coalesce(
    select(PayloadRow.body).where(PayloadRow.digest == SpanRow.attributes[(GENAI_MESSAGES, REF_KEY)].as_string())
    .scalar_subquery(), SpanRow.attributes[GENAI_MESSAGES].as_string()).label("messages"))
_PARTS_TEXT = '{"' + PARTS_KEY + '"'


def _parts_reference(text: str) -> dict[str, Any] | None:
    """The reference of a conversation stored in parts, from what `_GENAI_CONVERSATION` read in its place: the JSON
    text of the attribute's object (both databases give it as stored, compact, its key first); None for a
    conversation's own text."""
    if not text.startswith(_PARTS_TEXT):
        return None
    value = orjson.loads(text)
    return value if is_reference(value) else None


def _reviews(engine: Engine, ids: list[int]) -> dict[int, Any]:
    if not ids:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(select(ReviewRow.call_id, ReviewRow.after).where(
            ReviewRow.call_id.in_(ids), ReviewRow.decision.in_(("approve", "edit")))).all()
    return {row.call_id: row.after for row in rows}


def _eval_traces(engine: Engine, traces: list[list[StoredCall]], options: PartOptions) -> set[str]:
    """Of these traces, those whose rows go to eval. With `eval_after`, by when each began in the store: a trace whose
    first calls went to train in an earlier export stays there when `--since last` reads its later ones."""
    ids = [trace[0].trace_id for trace in traces]
    if options.eval_after is None:
        return {t for t in ids if unit(options.seed, "split", t) < options.eval_share}
    after = options.eval_after if options.eval_after.tzinfo else options.eval_after.replace(tzinfo=UTC)
    began = trace_starts(engine, ids, options.where.up_to_id)
    return {t for t in ids if began[t] >= after.timestamp() * 1e9}


def mine_part(engine: Engine, files: PartFiles, ends: tuple[int | None, int | None], options: PartOptions,
              progress: Callable[[int], None] | None = None) -> PartResult:
    """The rows of the traces whose last call's id falls in `ends`, written to `files` (left open: the caller closes
    them)."""
    result = PartResult()
    tools = _Tools(engine)
    conversations = _Conversations(engine)
    readings: dict[int, Reading] = {}  # a batch's: each output read once, for its repair, reference and prompt

    def reading(call: StoredCall) -> Reading:
        if (found := readings.get(call.id)) is None:
            found = readings[call.id] = read(call.raw, tools.indexes[call.toolset_id])  # type: ignore[index]
        return found

    collecting, frozen = gc.isenabled(), gc.get_freeze_count() > 0
    # a batch's calls, readings and repairs are hundreds of thousands of objects, alive until its rows are
    # written, and the caches and sets that outlive it grow batch by batch: the cyclic collector scanned both over and
    # over (a sixth of the CPU). It is paused for the batch and collects once at its end (the cycles a batch leaves,
    # ast.literal_eval's closures among them); what outlives the batch is frozen, left out of later collections (caches
    # and sets are freed by reference counting), and handed back when the part ends. A caller that froze objects of
    # its own (a server, before it forks) keeps them frozen: nothing is frozen or unfrozen here then.
    gc.disable()
    try:
        for traces in iter_traces(engine, options.where, options.batch, ends, unread=_UNREAD):
            calls = [c for trace in traces for c in trace]
            result.stats["calls_read"] += len(calls)
            indexes = tools.for_calls(calls)
            chosen: list[_Chosen] = []
            in_eval = _eval_traces(engine, traces, options)
            for trace in traces:
                repairs = find_repairs(trace, indexes, reading)
                split = "eval" if trace[0].trace_id in in_eval else "train"
                for call in trace:
                    if call.toolset_id not in indexes:
                        result.stats["no_tools_known"] += 1
                        continue
                    repair = repairs.get(call.id)
                    if repair is not None:
                        result.links.update((c.id, call.id) for c in repair.calls)
                    if call.failed or unit(options.seed, "valid", str(call.id)) < options.valid_rate:
                        chosen.append((split, call, repair.calls if repair is not None else None))
            reviews = _reviews(engine, [c.id for _, c, _ in chosen if c.failed])
            for (split, call, repair), context in conversations.along(chosen):
                index = indexes[call.toolset_id]  # type: ignore[index]
                read_as = reading(call)
                reference = reference_for(call, index, context.messages, reviews.get(call.id), repair, read_as)
                prompt = build_prompt(call.raw, index, context.messages, options.prompt, reading=read_as)
                if not files.write(split, build_row(call, prompt, context, reference), prompt_digest(prompt)):
                    result.stats["duplicates_dropped"] += 1
            if progress is not None:
                progress(len(calls))
            readings.clear()
            del calls, chosen
            gc.collect()
            if not frozen:
                gc.freeze()
    finally:
        if not frozen:
            gc.unfreeze()
        if collecting:
            gc.enable()
    return result


# --- in a worker process --------------------------------------------------------------------------------------------

_engine: Engine | None = None
_counter: Any = None


def init_worker(url: str, counter: Any) -> None:
    global _engine, _counter
    from tracemill.store.engine import make_engine

    _engine, _counter = make_engine(url), counter


def _count(n: int) -> None:
    with _counter.get_lock():
        _counter.value += n


def run_part(folder: Path, part: int, ends: tuple[int | None, int | None], options: PartOptions) -> PartResult:
    assert _engine is not None, "init_worker first"
    files = PartFiles(folder, part)
    try:
        return mine_part(_engine, files, ends, options, _count)
    finally:
        files.close()
