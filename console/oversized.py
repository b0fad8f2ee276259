"""Answers for requests whose head is too large to read: 414 and 431, in the API's error shape.

Twisted, under daphne, reads a request line and each header line up to ``MAX_LENGTH`` bytes
and a request's head up to ``totalHeadersSize`` (16 KB each). Past the first it closed the
connection without a word, and past the second it answered a bare 400 with no body (issue
21: a URL over ~16 KB got no answer). ``OversizedChannel`` answers instead, once, then
closes: 414 URI Too Long when the request line alone is too long, 431 Request Header Fields
Too Large when the headers are, each with ``{"error": {"code", "message", "detail":
{"limit"}}}``. The limits stay Twisted's.
"""

from __future__ import annotations

import json
from http import HTTPStatus

from daphne.http_protocol import HTTPFactory
from twisted.web import http

from console.api.errors import error_body


class OversizedChannel(http.HTTPChannel):
    """Twisted's HTTP/1.1 channel, answering a head it will not read (see the module)."""

    def lineLengthExceeded(self, line: bytes) -> None:
        # No line of this request counted yet: the long one is the request line.
        self._refuse(first_line=self._receivedHeaderSize == 0)

    def lineReceived(self, line: bytes) -> None:
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            self._refuse(first_line=self._receivedHeaderSize == 0)
            return
        super().lineReceived(line)

    def _refuse(self, *, first_line: bool) -> None:
        """Answer 414 (the request line) or 431 (the headers), then read nothing more."""
        if first_line:
            status, code, what = HTTPStatus.REQUEST_URI_TOO_LONG, "uri_too_long", "request line"
            limit = self.MAX_LENGTH
        else:
            status = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
            code, what, limit = "header_fields_too_large", "request's head", self.totalHeadersSize
        body = json.dumps(
            error_body(code, f"the {what} is over {limit} bytes", {"limit": limit})
        ).encode()
        head = (
            f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        # The rest of the request may still be arriving: ignore it (it would otherwise be
        # read as more lines, and answered again) while the answer is sent and the
        # connection closed.
        self.dataReceived = lambda data: None  # type: ignore[method-assign]
        self.write(head.encode() + body)
        self.loseConnection()


def oversized_protocol(factory: HTTPFactory) -> http._GenericHTTPChannelProtocol:
    """What Twisted's HTTPFactory builds per connection, with OversizedChannel inside (the
    generic protocol is the one that can switch a connection to HTTP/2, as before)."""
    return http._GenericHTTPChannelProtocol(OversizedChannel())


def install() -> None:
    """Make daphne's HTTP factory, in this process, build connections on OversizedChannel."""
    HTTPFactory.protocol = oversized_protocol
