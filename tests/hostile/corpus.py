"""One corpus of hostile values, shared by every test of ``tests/hostile``.

Each value comes in the forms the surfaces take: ``TEXT`` as Python strings (for JSON bodies,
form fields and CLI arguments), ``ARGUMENT_TEXTS`` as the raw argument text a model might
write (JSON escapes, so the script that carries them is itself storable), ``PATH_SEGMENTS`` as
URL-encoded path pieces and ``RAW_BYTES`` as bytes that are not UTF-8.
"""

from __future__ import annotations

import json

DEEP = 20_000  # levels of nesting: too deep for any recursive parser's default limit
HUGE_DIGITS = 5_000  # over Python's 4,300-digit int conversion limit

# Text values a person or a client can send (str), by name.
TEXT = {
    "nul": "a\x00b",
    "lone_surrogate": "a\ud800b",
    "html": "<script>window.__pwned = 1</script><img src=x onerror=alert(1)>",
    "huge": "x" * 300_000,
}

# JSON values (Python) a client can send where JSON is free-form.
JSON_VALUES = {
    "nul_value": {"k": "\x00"},
    "nul_key": {"\x00": 1},
    "surrogate_value": {"k": "\ud800"},
    "deep": json.loads("[" * 40 + "]" * 40),
}

# The raw argument text of a tool call, as a model writes it.
ARGUMENT_TEXTS = {
    "nul": '{"key": "a\\u0000b"}',
    "lone_surrogate": '{"key": "a\\ud800b"}',
    "deep": '{"key": "k", "x": ' + "[" * DEEP + "]" * DEEP + "}",
    "huge_int": '{"key": "k", "n": ' + "9" * HUGE_DIGITS + "}",
    "huge_float": '{"key": "k", "n": 1e400}',
    "nul_key": '{"key": "k", "\\u0000": 1}',
}

# Run and ticket ids in URL paths (already percent-encoded where needed).
PATH_SEGMENTS = {
    "nul": "%00",
    "surrogate": "%ED%A0%80",
    "invalid_utf8": "%FF%FE",
    "tilde": "~x~",
    "long": "a" * 100,
    "dots": "..",
    "html": "%3Cscript%3E",
}

# Cursors: the API's own encoding (URL-safe base64 of a JSON pair) around hostile content.
RAW_BYTES = {"invalid_utf8": b"\xff\xfe\xfd", "nul": b"\x00"}


def crafted_cursors() -> dict[str, str]:
    """Cursors that decode (base64, JSON) to something the API never issued."""
    import base64

    def encode(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    return {
        "nul_id": encode(json.dumps(["2026-01-01T00:00:00+00:00", "\x00"]).encode()),
        "surrogate_id": encode(b'["2026-01-01T00:00:00+00:00", "\\ud800"]'),
        "nul_time": encode(json.dumps(["2026-01-01T00:00:00\x00", "x"]).encode()),
        "invalid_utf8": encode(RAW_BYTES["invalid_utf8"]),
        "not_a_pair": encode(b"[1]"),
        "huge_int": encode(b"[" + b"9" * HUGE_DIGITS + b', "x"]'),
        "deep": encode(b"[" * DEEP + b"]" * DEEP),
    }
