"""What the million-call store's copies flatter: one process mines a window of it (`mine_part`, as a worker does),
with the name-ranking caches as they are, then with them emptied before every batch of calls.

The store (`bench/mine.py`) repeats a base corpus of 26,870 calls 37 times, each copy with its own trace ids and user
request but the same model outputs. The tool-name scores behind a prompt's nearest tools are remembered
(`tracemill.reviser_prompt`), so from the second copy on nearly every ranking is a cache hit; production traffic repeats
tool names and toolsets, but not a whole corpus of misspelled names. Emptying the caches before each batch of 2,000
calls is the other end: no name is remembered from one batch to the next. Real traffic lies between the two; the
export is the same either way (the content hash of its lines is printed beside each time). Each run also times the
rankings worked out anew (`_name_scores` called for names and tools it does not remember).

Run by hand, never in CI, on the store `bench/mine.py` built (see bench/README.md, "Mine"):

    flock /tmp/tracemill-bench.lock .venv/bin/python bench/mine_unrepeated.py --db sqlite:///$PWD/bench/out/mine.db \\
        --out bench/out/mine_unrepeated.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from tracemill import reviser_prompt, tools
from tracemill.miner import part
from tracemill.reviser_prompt import PromptSettings
from tracemill.store.engine import make_engine
from tracemill.store.queries import CallFilter

from mine import loop_seconds, machine, save

NAME_CACHES = ("_keys", "_key_similarity", "_name_score", "_letters", "_name_scores", "_near_miss", "_closest")


def _emptied_each_batch(read: Any) -> Any:
    def batches(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for batch in read(*args, **kwargs):
            for name in NAME_CACHES:  # another commit's module may not have them all
                if hasattr(cache := getattr(reviser_prompt, name, None), "cache_clear"):
                    cache.cache_clear()
            tools.name_key.cache_clear()
            yield batch

    return batches


def _timed_rankings() -> list[float]:
    """`reviser_prompt._name_scores`, cached as before, with the seconds of each ranking worked out anew."""
    seconds: list[float] = []
    cached = reviser_prompt._name_scores
    rank = cached.__wrapped__

    def timed(*args: Any) -> Any:
        started = time.perf_counter()
        try:
            return rank(*args)
        finally:
            seconds.append(time.perf_counter() - started)

    reviser_prompt._name_scores = lru_cache(maxsize=cached.cache_info().maxsize)(timed)
    return seconds


def run(url: str, after: int, upto: int) -> dict[str, Any]:
    """One window mined in this process (a quarter of the valid calls sampled, a tenth of traces to eval); wall and CPU
    seconds, rows, a hash of the lines written, and the rankings worked out anew with their seconds."""
    rankings = _timed_rankings()
    with tempfile.TemporaryDirectory() as work:
        files = part.PartFiles(Path(work), 0)
        options = part.PartOptions(CallFilter(after_id=after, up_to_id=upto), None, 0.1, 0.25, 0, PromptSettings(),
                                   2000)
        started, cpu = time.perf_counter(), time.process_time()
        part.mine_part(make_engine(url), files, (None, None), options)
        files.close()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        digest, rows = hashlib.sha256(), 0
        for split in part.SPLITS:
            lines = Path(work, f"part-0-{split}.jsonl").read_bytes()
            digest.update(lines)
            rows += lines.count(b"\n")
    return {"seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1), "rows": rows,
            "lines_sha256": digest.hexdigest(), "rankings_anew": len(rankings),
            "rankings_anew_seconds": round(sum(rankings), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", required=True, help="the store bench/mine.py built")
    parser.add_argument("--after", type=int, default=500_000, help="the window: calls after this id ...")
    parser.add_argument("--upto", type=int, default=600_000, help="... up to this one")
    parser.add_argument("--one", choices=("kept", "emptied"), help="one run, in this process, with the caches so")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    if args.one is not None:
        if args.one == "emptied":
            part.iter_traces = _emptied_each_batch(part.iter_traces)
        print(json.dumps(run(args.db, args.after, args.upto)))
        return
    figures: dict[str, Any] = {"machine": machine(), "window": [args.after, args.upto], "runs": []}
    before = loop_seconds()
    for caches in ("kept", "emptied", "kept", "emptied"):  # each in a fresh process: nothing remembered from another
        command = [sys.executable, __file__, "--db", args.db, "--after", str(args.after), "--upto", str(args.upto),
                   "--one", caches]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        figures["runs"].append({"caches": caches, **json.loads(done.stdout)})
        print(figures["runs"][-1], file=sys.stderr)
    figures["loop_seconds"] = [before, loop_seconds()]
    save(figures, args.out)


if __name__ == "__main__":
    main()
