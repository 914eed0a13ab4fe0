"""`run_cycle` in a process of its own, as cron starts it, that can stop dead at a step: with PAUSE_AT given, it
prints PAUSED and sleeps when a progress line starts with it, so that the test kills it (SIGKILL) exactly there.

    python cycle_driver.py CONFIG.toml STORE_URL [PAUSE_AT]
"""

import sys
import time
from pathlib import Path

from tracemill.cycle import run_cycle
from tracemill.cycle.settings import load_settings


def main() -> None:
    config, store = Path(sys.argv[1]), sys.argv[2]
    pause_at = sys.argv[3] if len(sys.argv) > 3 else None

    def progress(line: str) -> None:
        print(line, flush=True)
        if pause_at and line.startswith(pause_at):
            print("PAUSED", flush=True)
            time.sleep(3600)

    done = run_cycle(load_settings(config, store), progress)
    print(f"RESULT {done.id} {done.status} {done.decision} deployed={done.deployed}", flush=True)


if __name__ == "__main__":
    main()
