"""Local network helpers for the processes Tracemill starts (the demo's model server, tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerThread:
    """An ASGI app served by uvicorn on a free port of 127.0.0.1, in a daemon thread (uvicorn installs no signal
    handlers outside the main thread, so Ctrl-C stays with the caller). The port is bound here and the socket handed
    to uvicorn: no other process can take it in between."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port = int(self.socket.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def start(self, timeout: float = 20.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        self.socket.close()
