"""A real local HTTP receiver for the webhook tests: it records every request it gets (body,
headers, whether the Standard Webhooks signature verifies) and answers as told: 200, 500, or
after holding the request until released. It can be down (not listening) and come back on
the same port."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    message_id: str
    payload: Any
    verified: bool


@dataclass
class Receiver:
    secret: str
    status: int = 200
    hold: threading.Event | None = None  # requests wait for it, then answer `status`
    port: int = 0
    got: list[Received] = field(default_factory=list)
    holding: int = 0  # requests waiting on `hold` now
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def __post_init__(self) -> None:
        if not self.port:
            with socket.socket() as s:  # a free port, closed again: "down" until start()
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    Webhook(receiver.secret).verify(body, headers)
                    verified = True
                except WebhookVerificationError:
                    verified = False
                with receiver.lock:
                    receiver.got.append(
                        Received(headers.get("webhook-id", ""), json.loads(body), verified)
                    )
                if receiver.hold is not None:
                    with receiver.lock:
                        receiver.holding += 1
                    receiver.hold.wait(120)
                    with receiver.lock:
                        receiver.holding -= 1
                try:
                    self.send_response(receiver.status)
                    self.end_headers()
                    self.wfile.write(b"ok" if receiver.status < 300 else b"receiver error")
                except OSError:  # the sender is gone (killed)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def ids(self) -> list[str]:
        with self.lock:
            return [r.message_id for r in self.got]
