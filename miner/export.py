"""`tracemill mine`: failed calls (and a share of valid ones) as RL prompt rows, split by trace, deduplicated, written
as JSON Lines and Parquet with a card, and recorded in `datasets`.

The store is read in the order it holds the calls and given trace by trace (`queries.iter_traces`: whole traces, in the
order their last call was stored), so that an agent's repair is found beside the call it repaired, memory stays flat
however large the store, and a store larger than memory is read along its files. Everything the export holds follows
from the store and the options: rows come trace by trace in that order, valid calls are sampled by a hash of their id,
traces go to eval by a hash of their id (or, with `eval_after`, by when they began), and of two rows with the same
prompt only the first is kept. The export is written to a hidden folder beside `out` and renamed into place at the
end: a run stopped half-way leaves no export, and an earlier export at `out` stays whole until the new one replaces
it, in one step where the system can swap two folders (a run killed outright leaves its hidden folder, which the next
run to the same `out` removes, putting back first an earlier export it had moved aside).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import itertools
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, and_, bindparam, func, insert, select, update

from tracemill.miner.parquet import RowWriter
from tracemill.miner.part import (
    SPLITS,
    PartFiles,
    PartOptions,
    PartResult,
    init_worker,
    mine_part,
    part_files,
    run_part,
)
from tracemill.reviser_prompt import PromptSettings
from tracemill.store.queries import CallFilter, Committed, committed_ids, first_failed_late
from tracemill.store.sqlite_writer import WriteLock, database_path
from tracemill.store.tables import DatasetRow, ToolCallRow, utcnow

FORMAT = "tracemill.rl-prompts/1"


class ExportError(ValueError):
    """An output folder that cannot take an export; the message names it."""


@dataclass(frozen=True, slots=True)
class MineOptions:
    where: CallFilter = CallFilter()
    since_last: bool = False  # only what is new since the previous export read (`previous_read`)
    eval_after: datetime | None = None  # eval: the traces whose first call was made at or after this; else a hash
    eval_share: float = 0.1
    valid_share: float = 0.2  # of the rows: valid calls, labelled as such
    seed: int = 0
    prompt: PromptSettings = PromptSettings()
    batch: int = 2000  # calls read at a time (a worker's memory grows with a batch's conversations and readings)
    workers: int = 1  # processes, each mining the traces ending in a range of ids; the same export for any number


@dataclass(slots=True)
class ExportResult:
    path: Path
    dataset_id: int
    card: dict[str, Any]

    @property
    def rows(self) -> dict[str, int]:
        return {s: self.card["splits"][s]["rows"] for s in SPLITS}


def is_export(path: Path) -> bool:
    try:
        return orjson.loads((path / "dataset.json").read_bytes()).get("format") == FORMAT
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return False


def check_out(out: Path) -> None:
    """Refuse an output folder that holds anything but an earlier export (it would be replaced)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not is_export(out):
        raise ExportError(f"{out} exists and is not a Tracemill export (no dataset.json of format {FORMAT}); "
                          "choose another --out")


def _valid_rate(engine: Engine, where: CallFilter, share: float) -> float:
    """The share of valid calls to sample so that they make `share` of the rows (of the calls whose tools are known:
    no other makes a row)."""
    if share <= 0:
        return 0.0
    known = select(func.count()).where(ToolCallRow.toolset_id.is_not(None))
    with engine.connect() as conn:
        failed = int(conn.execute(replace(where, failed=True).apply(known)).scalar_one())
        valid = int(conn.execute(replace(where, failed=False).apply(known)).scalar_one())
    if share >= 1 or valid == 0:
        return 1.0
    return min(1.0, share / (1 - share) * failed / valid)


# where an export starts and ends, not what it selects
_WINDOW = ("since", "until", "after_id", "up_to_id", "since_call_id", "since_execution_id", "up_to_execution_id")


def _selection(filters: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in filters.items() if k not in (*_WINDOW, "since_last") and v is not None}


def previous_read(engine: Engine, where: CallFilter = CallFilter()) -> Committed | None:
    """The newest call and execution the last export of the same selection (model, harness version, domain, tool, ...)
    read: where `--since last` starts. An export of other calls read past calls this one has not exported. None when
    there was none."""
    wanted = _selection(where.to_dict())
    with engine.connect() as conn:
        for row in conn.execute(select(DatasetRow.filters, DatasetRow.last_call_id, DatasetRow.card)
                                .order_by(DatasetRow.id.desc())):
            if _selection(row.filters or {}) == wanted:
                return Committed(row.last_call_id, (row.card or {}).get("last_execution_id"))
    return None


def bounded(where: CallFilter, committed: Committed) -> CallFilter:
    """`where` read no further than these ids (`queries.committed_ids`), nor than the bounds it has."""
    calls = min((i for i in (committed.call_id, where.up_to_id) if i is not None), default=None)
    executions = committed.execution_id or 0
    if where.up_to_execution_id is not None:
        executions = min(executions, where.up_to_execution_id)
    return replace(where, up_to_id=calls, up_to_execution_id=executions)


def since_read(engine: Engine, where: CallFilter, previous: Committed) -> CallFilter:
    """`where` narrowed to what is new since `previous` was read: the calls after its newest, and the earlier calls
    whose execution came after it and failed (`queries.failed_late`; such a call was valid when it was read), read
    from the first of those."""
    if previous.call_id is None:
        return where
    start = previous.call_id
    if previous.execution_id is not None:
        with engine.connect() as conn:
            late = first_failed_late(conn, where, previous.call_id, previous.execution_id)
        if late is not None:
            start = late - 1
    return replace(where, since_call_id=previous.call_id, since_execution_id=previous.execution_id,
                   after_id=max(start, where.after_id or 0))


def mine(engine: Engine, out: Path, options: MineOptions = MineOptions(),
         progress: Callable[[int], None] | None = None) -> ExportResult:
    """Export the calls `options` select to `out` (see the module docstring); `progress` gets the calls read."""
    out = out.resolve()
    check_out(out)
    # read no further than what is committed (calls, and the executions counted): the next `--since last` starts here
    where = bounded(options.where, committed_ids(engine))
    previous = previous_read(engine, where) if options.since_last else None
    if previous is not None:
        where = since_read(engine, where, previous)
    valid_rate = _valid_rate(engine, where, options.valid_share)
    out.parent.mkdir(parents=True, exist_ok=True)
    _clear_leftovers(out)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        card = _write(engine, work, where, options, valid_rate, progress)
        card["name"] = out.name
        card["filters"] = {**where.to_dict(), "since_last": options.since_last}
        before = previous or Committed(None, None)
        card["last_call_id"] = max((i for i in (where.up_to_id, before.call_id) if i is not None), default=None)
        # 0 where no execution is stored yet (None: an export made before executions were followed)
        card["last_execution_id"] = max(where.up_to_execution_id or 0, before.execution_id or 0)
        (work / "dataset.json").write_bytes(orjson.dumps(card, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        _replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    dataset_id = _record(engine, out, card)
    return ExportResult(out, dataset_id, card)


def _clear_leftovers(out: Path) -> None:
    """What a run killed outright (SIGKILL, power) left beside `out`: its half-written export, and an earlier export it
    had moved aside to put its own in place, which goes back to `out` where nothing took its place."""
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for aside in out.parent.glob(f".{out.name}.old-*"):
        if not out.exists() and is_export(aside / "export"):
            os.replace(aside / "export", out)
        shutil.rmtree(aside, ignore_errors=True)


def _replace(work: Path, out: Path) -> None:
    if not out.exists():
        os.replace(work, out)
        return
    if _exchange(work, out):  # one step: `out` is never missing, whenever the run is killed
        shutil.rmtree(work, ignore_errors=True)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old / "export")
    os.replace(work, out)
    shutil.rmtree(old, ignore_errors=True)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths at once (Linux's `renameat2` with RENAME_EXCHANGE); False where the system or its file system
    cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(error, os.strerror(error), str(b))


def _ranges(engine: Engine, where: CallFilter, workers: int) -> list[tuple[int | None, int | None]]:
    """Ranges of call ids, one per worker, in order: a worker gives the traces whose last call's id falls in its
    range (`queries.iter_traces`' `ends`), so that the parts, one after another, hold the traces in the order one
    reader gives them."""
    if workers == 1:
        return [(None, None)]
    with engine.connect() as conn:
        low, high = conn.execute(where.apply(select(func.min(ToolCallRow.id), func.max(ToolCallRow.id)))).one()
    if low is None:
        return [(None, None)]
    bounds = [None, *(low + (high + 1 - low) * n // workers for n in range(1, workers)), None]
    return list(itertools.pairwise(bounds))


def _run_parts(engine: Engine, first: PartFiles, options: PartOptions, workers: int,
               progress: Callable[[int], None] | None) -> list[PartResult]:
    """The first range mined here, into `first`, and the others by worker processes beside it."""
    ranges = _ranges(engine, options.where, workers)
    if len(ranges) == 1:
        return [mine_part(engine, first, ranges[0], options, progress)]
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited connections or locks
    counter = context.Value("q", 0)
    url = engine.url.render_as_string(hide_password=False)
    pool = context.Pool(len(ranges) - 1, initializer=init_worker, initargs=(url, counter))
    shown = 0

    def step(calls: int) -> None:  # between batches of the first range: the workers' progress, and their failures
        nonlocal shown
        for waiting in pending:
            if waiting.ready() and not waiting.successful():
                waiting.get()
        if progress is not None:
            now = counter.value
            progress(calls + now - shown)
            shown = now

    try:
        pending = [pool.apply_async(run_part, (first.folder, n, r, options)) for n, r in enumerate(ranges[1:], 1)]
        results = [mine_part(engine, first, ranges[0], options, step)]
        for waiting in pending:
            while not waiting.ready():
                waiting.wait(0.2)
                step(0)
        step(0)
        results += [p.get() for p in pending]
        pool.close()
        return results
    finally:
        pool.terminate()
        pool.join()


def _merge(first: PartFiles, parts: int) -> tuple[dict[str, Any], int, str]:
    """The parts' files as one JSON Lines and one Parquet file per split, in part order; of two rows with the same
    prompt only the first is kept (a part has kept only the first of its own). Which rows are kept is read from the
    `.meta` lines; then the first part's lines become the split's file and the later parts' kept lines are copied in
    by the kernel, while the first part's Parquet writer, still open, takes the later parts' kept rows (decoded and
    encoded again by Arrow): all four files at once (neither holds the GIL), so that the merge costs little next to the
    mining. Returns the splits' summaries, the duplicates dropped and the content hash (of every kept line's hash, in
    order)."""
    work = first.folder
    seen: set[str] = set()
    dropped = 0
    summaries = {}
    content = hashlib.sha256()
    masks: dict[str, tuple[list[list[bool]], list[list[int]]]] = {}
    for split in SPLITS:
        rows = 0
        digest = hashlib.sha256()
        counts: dict[str, Counter[str]] = {k: Counter() for k in _COUNTED}
        kept: list[list[bool]] = []
        lengths: list[list[int]] = []
        for part in range(parts):
            mask, sizes = [], []
            for info in part_files(work, part, split)[1].read_bytes().splitlines():
                key, line_hash, size, *values = orjson.loads(info)
                keep = key not in seen
                mask.append(keep)
                sizes.append(size)
                if not keep:
                    dropped += 1
                    continue
                seen.add(key)
                rows += 1
                digest.update(line_hash.encode())
                for name, value in zip(_COUNTED, values, strict=True):
                    counts[name]["none" if value is None else str(value)] += 1
            kept.append(mask)
            lengths.append(sizes)
        masks[split] = (kept, lengths)
        summaries[split] = {"rows": rows, "sha256": digest.hexdigest(),
                            **{k: dict(sorted(c.items())) for k, c in counts.items()}}
        content.update(f"{split}:{summaries[split]['sha256']}\n".encode())
    with ThreadPoolExecutor(2 * len(SPLITS)) as pool:
        copies = [pool.submit(_copy_lines, work, split, *masks[split]) for split in SPLITS]
        copies += [pool.submit(_extend_parquet, first, split, *masks[split]) for split in SPLITS]
        for copy in copies:
            copy.result()
    for split in SPLITS:
        for part in range(parts):
            part_files(work, part, split)[1].unlink()
    return summaries, dropped, content.hexdigest()


def _extend_parquet(first: PartFiles, split: str, kept: list[list[bool]], lengths: list[list[int]]) -> None:
    writer = first.parquet[split]
    final = first.folder / f"{split}.parquet"
    whole = all(kept[0])  # the first part keeps every row, unless (eval) a train row had the same prompt
    if not whole:
        writer.close()
        writer = RowWriter(final)
    for part in range(0 if not whole else 1, len(kept)):
        path = part_files(first.folder, part, split)[2]
        writer.append_part(path, kept[part], lengths[part])
        path.unlink()
    writer.close()
    if whole:
        os.replace(part_files(first.folder, 0, split)[2], final)


def _copy_lines(work: Path, split: str, kept: list[list[bool]], lengths: list[list[int]]) -> None:
    path = work / f"{split}.jsonl"
    whole = all(kept[0])  # the first part keeps every line, unless (eval) a train line had the same prompt
    if whole:
        os.replace(part_files(work, 0, split)[0], path)
    else:
        path.touch()
    # not opened to append: copy_file_range refuses a file opened with O_APPEND (EBADF)
    with open(path, "r+b") as out:
        out.seek(0, os.SEEK_END)
        for part in range(0 if not whole else 1, len(kept)):
            lines = part_files(work, part, split)[0]
            with open(lines, "rb") as source:
                for start, length in _kept_ranges(kept[part], lengths[part]):
                    _copy_range(source, out, start, length)
            lines.unlink()  # freeing gigabytes takes seconds: here, beside the Parquet merge


def _kept_ranges(mask: list[bool], lengths: list[int]) -> list[tuple[int, int]]:
    """(offset, length) of each run of kept lines: a part is copied in as few ranges as it has runs."""
    ranges: list[tuple[int, int]] = []
    offset = 0
    for keep, length in zip(mask, lengths, strict=True):
        if keep:
            if ranges and sum(ranges[-1]) == offset:
                ranges[-1] = (ranges[-1][0], ranges[-1][1] + length)
            else:
                ranges.append((offset, length))
        offset += length
    return ranges


def _copy_range(source: Any, out: Any, offset: int, length: int) -> None:
    out.flush()
    while length > 0:
        try:
            done = os.copy_file_range(source.fileno(), out.fileno(), length, offset)
        except (AttributeError, OSError):  # no copy_file_range here: copy through Python, a megabyte at a time
            source.seek(offset)
            while length > 0:
                chunk = source.read(min(length, 1 << 20))
                if not chunk:
                    raise OSError(f"{source.name}: short read at byte {offset}") from None
                out.write(chunk)
                length -= len(chunk)
            return
        if done == 0:
            raise OSError(f"{source.name}: short read at byte {offset}")
        offset += done
        length -= done


_COUNTED = ("failure_class", "provenance", "model", "harness_version")


def _write(engine: Engine, work: Path, where: CallFilter, options: MineOptions, valid_rate: float,
           progress: Callable[[int], None] | None) -> dict[str, Any]:
    part_options = PartOptions(where, options.eval_after, options.eval_share, valid_rate, options.seed,
                               options.prompt, options.batch)
    first = PartFiles(work, 0)
    try:
        results = _run_parts(engine, first, part_options, max(1, options.workers), progress)
        first.close_lines()
        stats: Counter[str] = Counter()
        links: dict[int, int] = {}
        for result in results:
            stats.update(result.stats)
            links.update(result.links)
        with ThreadPoolExecutor(1) as linking:  # the store's writes go on beside the merge's file copies
            linked = linking.submit(_link_repairs, engine, links)
            summaries, dropped, content = _merge(first, len(results))
            linked.result()
    finally:
        first.close()
    return {
        "format": FORMAT, "name": "", "created_at": datetime.now(UTC).isoformat(), "content_hash": content,
        "splits": summaries, "counts": _totals(summaries),
        "split": {"by": "trace", "eval_after": options.eval_after.isoformat() if options.eval_after else None,
                  "eval_share": None if options.eval_after else options.eval_share, "seed": options.seed},
        "valid_share": options.valid_share, "valid_sample_rate": valid_rate, "repairs_linked": len(links),
        "prompt_settings": options.prompt.to_dict(), "calls_read": stats["calls_read"],
        "duplicates_dropped": dropped + stats["duplicates_dropped"], "no_tools_known": stats["no_tools_known"],
        "files": [f"{s}.{ext}" for s in SPLITS for ext in ("jsonl", "parquet")],
    }


def _totals(summaries: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {"rows": sum(s["rows"] for s in summaries.values())}
    for key in _COUNTED:
        merged: Counter[str] = Counter()
        for s in summaries.values():
            merged.update(s[key])
        totals[key] = dict(sorted(merged.items()))
    return totals


def _writing(engine: Engine) -> Any:
    """The store's write lock, taken in turn with the collector's writers (SQLite)."""
    path = database_path(engine.url.render_as_string(hide_password=False))
    return WriteLock(path).held() if path is not None else nullcontext()


def _link_repairs(engine: Engine, links: dict[int, int]) -> None:
    """`tool_calls.repairs_id` of each repair found: the (latest) failed call it repaired."""
    if not links:
        return
    calls = ToolCallRow.__table__
    statement = (update(calls).where(and_(calls.c.id == bindparam("r"), calls.c.repairs_id.is_(None)))
                 .values(repairs_id=bindparam("f")))
    items = sorted(links.items())
    with _writing(engine):
        for start in range(0, len(items), 5000):
            with engine.begin() as conn:
                conn.execute(statement, [{"r": r, "f": f} for r, f in items[start:start + 5000]])


def _record(engine: Engine, out: Path, card: dict[str, Any]) -> int:
    row = {"name": out.name, "path": str(out), "content_hash": card["content_hash"], "filters": card["filters"],
           "last_call_id": card["last_call_id"], "train_rows": card["splits"]["train"]["rows"],
           "eval_rows": card["splits"]["eval"]["rows"], "card": card, "created_at": utcnow()}
    with _writing(engine), engine.begin() as conn:
        inserted = conn.execute(insert(DatasetRow).values(**row).returning(DatasetRow.id)).scalar_one()
        return int(inserted)
