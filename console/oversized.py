"""Answers for requests whose head is too large to read: 414 and 431, in the API's error shape;
and every body left to Django.

Twisted, under daphne, reads a request line and each header line up to ``MAX_LENGTH`` bytes
and a request's head up to ``totalHeadersSize`` (16 KB each). Past the first it closed the
connection without a word, and past the second it answered a bare 400 with no body (issue
21: a URL over ~16 KB got no answer). ``OversizedChannel`` answers instead, once, then
closes: 414 URI Too Long when the request line alone is too long, 431 Request Header Fields
Too Large when the headers are, each with ``{"error": {"code", "message", "detail":
{"limit"}}}``. The limits stay Twisted's.

Twisted also parses a POST's form or multipart body into ``request.args``, which daphne never
reads, and answered a multipart body it could not parse (a missing or malformed boundary) with
a bare 400 before Django saw it (issue 31, item 9). The channel's requests are made with
Twisted's ``parsePOSTFormSubmission=False``: every body reaches Django as it came, so the API
answers it in its error shape (415 for anything but JSON) and the console as Django does.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from http import HTTPStatus

from daphne.http_protocol import HTTPFactory
from twisted.web import http

from console.api.errors import error_body


class OversizedChannel(http.HTTPChannel):
    """Twisted's HTTP/1.1 channel, answering a head it will not read, and making requests
    that leave their body to Django (see the module)."""

    _request_class: Callable[..., http.Request] = http.Request

    @property  # type: ignore[override]  # Twisted declares a class attribute
    def requestFactory(self) -> Callable[..., http.Request]:
        """The request class daphne sets (its ``WebRequest``), made without parsing forms."""
        return functools.partial(self._request_class, parsePOSTFormSubmission=False)

    @requestFactory.setter
    def requestFactory(self, factory: Callable[..., http.Request]) -> None:
        self._request_class = factory

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
