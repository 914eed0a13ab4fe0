"""`tracemill collector` and `tracemill serve` with `--port 0` listen on a port the system picks and say which: a
second collector beside a running one, or a script that starts its own, never takes the default port by surprise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.timeout(60)

COMMANDS = {
    "collector": ["collector", "--grpc-port", "0", "--workers", "1"],
    "serve": ["serve", "--upstream", "http://127.0.0.1:9/v1"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_port_0_listens_on_a_port_the_system_picks_and_says_which(command: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tracemill.cli", *COMMANDS[command], "--port", "0",
                                 "--db", f"sqlite:///{tmp_path / 'store.db'}", "--log-level", "info"],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 40
        while (said := re.search(r"running on http://127\.0\.0\.1:(\d+)", log.read_text())) is None:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        port = int(said[1])
        assert port not in (0, 4318, 8000)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
