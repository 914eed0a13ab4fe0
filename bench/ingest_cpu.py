"""CPU seconds one ingest process spends per request (decode, extract and verify, commit), on bench/ingest.py's
workload and a fresh SQLite store: the collector's per-request cost without the HTTP process, the load generator or
the scheduler, so that two commits can be compared on a machine other work shares (where bench/ingest.py's rates move
with that work). With `--db`, an empty store of your own (PostgreSQL: its server's work is not in the CPU figure, the
wall time per request is printed beside it).

Run by hand with the virtual environment of the checkout to measure (see bench/README.md, "Ingest"):

    .venv/bin/python bench/ingest_cpu.py
    .venv/bin/python bench/ingest_cpu.py --db postgresql+psycopg://postgres@127.0.0.1:5432/an_empty_database
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import tracemill
from tracemill.collector import worker
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade

from ingest import Bodies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="requests measured (default 60)")
    parser.add_argument("--warmup", type=int, default=10, help="requests ingested first, not measured (default 10)")
    parser.add_argument("--spans-per-request", type=int, default=512)
    parser.add_argument("--db", metavar="URL", help="an empty store to ingest into (default: a new SQLite file)")
    args = parser.parse_args()

    bodies = Bodies(8, args.spans_per_request, seed=1)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-cpu-") as workdir:
        url = args.db or f"sqlite:///{Path(workdir) / 'tracemill.db'}"
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        worker.start(worker.WorkerConfig(url, max_body_bytes=32 << 20, max_attribute_bytes=4 << 20))
        for seq in range(args.warmup):
            worker.ingest(bytes(bodies.body(seq)), "application/x-protobuf", False)
        started, wall = time.process_time(), time.perf_counter()
        for seq in range(args.warmup, args.warmup + args.requests):
            worker.ingest(bytes(bodies.body(seq)), "application/x-protobuf", False)
        cpu, wall = time.process_time() - started, time.perf_counter() - wall
    print(f"tracemill from {Path(tracemill.__file__).resolve().parent}, "
          f"collector from {Path(worker.__file__).resolve().parent}")
    print(f"{1000 * cpu / args.requests:.1f} ms CPU per request, "
          f"{1e6 * cpu / (args.requests * args.spans_per_request):.1f} µs per span ({args.requests} requests); "
          f"{1000 * wall / args.requests:.1f} ms wall per request")


if __name__ == "__main__":
    main()
