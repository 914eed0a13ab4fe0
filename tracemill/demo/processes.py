"""The processes the demo starts: each `tracemill` command in its own session, so that the terminal's Ctrl-C reaches
the demo alone and the demo stops them in order (the newest first); each one's output goes to a log file that an
error shows the end of."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

_LISTENING = re.compile(r"running on (http://[\w.]+:\d+)")  # uvicorn's line, with the port it listens on


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and shows the end of its log."""


class Processes:
    def __init__(self, logs: Path, env: Mapping[str, str] | None = None) -> None:
        self.logs = logs
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
        self.running: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """`tracemill ARGS...` in the background; its output goes to LOGS/NAME.log."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tracemill.cli", *args], stdout=log,
                                    stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.running.append((name, proc))
        return proc

    def tail(self, name: str, lines: int = 25) -> str:
        path = self.logs / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def run(self, name: str, *args: str, while_running: Callable[[], None] | None = None) -> str:
        """`tracemill ARGS...` to its end (calling `while_running` about every half second); its log. Raises
        DemoError when it fails."""
        proc = self.start(name, *args)
        while proc.poll() is None:
            if while_running is not None:
                while_running()
            try:
                proc.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        self.running.remove((name, proc))
        if proc.returncode != 0:
            raise DemoError(f"`tracemill {args[0]}` failed (exit status {proc.returncode}); the end of "
                            f"{self.logs / (name + '.log')}:\n{self.tail(name)}")
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def serve(self, name: str, *args: str, timeout: float = 60.0) -> str:
        """`tracemill ARGS... --port 0` in the background, on a port the system picks (no other process can take it
        between choosing and listening); its address once it answers."""
        log = self.logs / f"{name}.log"
        logged = log.stat().st_size if log.exists() else 0
        proc = self.start(name, *args, "--port", "0", "--log-level", "info")
        deadline = time.monotonic() + timeout
        url: str | None = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DemoError(f"`tracemill {name}` exited with status {proc.returncode}:\n{self.tail(name)}")
            if url is None:
                said = _LISTENING.search(log.read_bytes()[logged:].decode(errors="replace"))
                url = said[1] if said else None
            else:
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        return url
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        waited = f"answer at {url}" if url else "listen"
        raise DemoError(f"`tracemill {name}` did not {waited} within {timeout:.0f} s:\n{self.tail(name)}")

    def stop(self, name: str) -> None:
        for entry in [e for e in self.running if e[0] == name]:
            self._stop(*entry)

    def stop_all(self) -> None:
        for entry in reversed(list(self.running)):
            self._stop(*entry)

    def _stop(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the process's group (an ingest worker of the collector, a miner's worker), then SIGKILL to what
        is left after 30 s."""
        self.running.remove((name, proc))
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
        try:  # workers that outlived their parent
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
