"""Real server processes for tests: daphne (or ``runtime_serve``) on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM ``process``, then SIGKILL if it has not exited within ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def daphne_command(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "daphne",
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "console.asgi:application",
    ]


@contextmanager
def serving(
    env: dict[str, str],
    log: Path,
    command: list[str] | None = None,
    port: int | None = None,
    timeout: float = 30,
) -> Iterator[str]:
    """Start ``command`` (daphne on ``port`` by default) and yield its base URL once it
    accepts connections (within ``timeout`` seconds); stop it (SIGTERM, then SIGKILL) on exit.
    Output goes to ``log``."""
    port = port or free_port()
    out = log.open("w")
    process = subprocess.Popen(
        command or daphne_command(port), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    out.flush()
                    text = log.read_text()[-3000:]
                    raise RuntimeError(f"the server did not start: {text}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process, 10)
        out.close()
