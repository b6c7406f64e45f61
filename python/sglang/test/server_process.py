"""A server in a subprocess, a free port and percentiles: what tests and benchmarks share.

Standard library only, so that benchmark client processes that import it start without torch.

    with ServerProcess(["--port", str(port)], port=port) as server:
        requests.post(server.url + "/generate", json=...)
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

GROUP_STOP_WAIT_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank value at fraction q (0..1) of the sorted values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class ServerProcess:
    """`python -m sglang.launch_server` in a subprocess.

    Its output is kept in memory (`output`), or written to `log_path` when given. With
    own_process_group=True the server leads a process group of its own, and stop() also stops
    every process it started (a benchmark frees the GPU memory of all of them this way).
    """

    def __init__(
        self,
        argv: Sequence[str],
        port: int,
        env: Optional[dict[str, str]] = None,
        host: str = "127.0.0.1",
        api_key: Optional[str] = None,
        startup_timeout: float = 300.0,
        log_path: Optional[Path] = None,
        own_process_group: bool = False,
    ) -> None:
        self.url = f"http://{host}:{port}"
        self.command = [sys.executable, "-m", "sglang.launch_server", *argv]
        self.log_path = log_path
        self._host, self._port = host, port
        self._api_key = api_key
        self._startup_timeout = startup_timeout
        self._own_group = own_process_group
        self._output: list[str] = []
        self._log = open(log_path, "w") if log_path is not None else None
        stdout = self._log if self._log is not None else subprocess.PIPE
        self.proc = subprocess.Popen(
            self.command, env=env, stdout=stdout, stderr=subprocess.STDOUT, text=True,
            start_new_session=own_process_group,
        )
        self._reader: Optional[threading.Thread] = None
        if self._log is None:
            self._reader = threading.Thread(target=self._drain_output, daemon=True)
            self._reader.start()

    def _drain_output(self) -> None:
        # Kept (and never blocking the child) so a failed start can say why.
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._output.append(line)

    @property
    def output(self) -> str:
        if self.log_path is None:
            return "".join(self._output)
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "".join(self.output.splitlines(True)[-lines:])

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def wait_healthy(self, timeout: Optional[float] = None) -> None:
        """Poll /health until 200; RuntimeError with the server's output on exit or timeout."""
        timeout = self._startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with code {self.proc.returncode}:\n{self.output}")
            if self._health_status() == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(f"server not healthy after {timeout:.0f} s:\n{self.output}")

    def _health_status(self) -> Optional[int]:
        """/health's status, or None while nothing answers."""
        conn = http.client.HTTPConnection(self._host, self._port, timeout=30)
        try:
            conn.request("GET", "/health", headers=self.headers())
            response = conn.getresponse()
            response.read()
            return response.status
        except OSError:
            return None
        finally:
            conn.close()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after `timeout` (and to the whole group when it has one);
        returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                if not self._own_group:
                    self.proc.kill()
        if self._own_group:
            self._stop_group()
        self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        if self._log is not None:
            self._log.close()
        return self.proc.returncode

    def _stop_group(self) -> None:
        """SIGTERM, then SIGKILL to the server's process group until none of it is left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not _group_alive(self.proc.pid):
                return
            _signal_group(self.proc.pid, sig)
            deadline = time.monotonic() + GROUP_STOP_WAIT_S
            while self.proc.poll() is None or _group_alive(self.proc.pid):  # poll() reaps the leader
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)

    def __enter__(self) -> "ServerProcess":
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
