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

# Text within every limit that must still commit: 160,000 distinct words (about 1.1 MB, under
# the 2.5 MB body limit), too many for one PostgreSQL tsvector (tests/api/test_search.py).
LONG_WORDS = " ".join(f"w{n:x}" for n in range(160_000))

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

# Not whole numbers, as a person types them into a query string or a form: str.isdigit()
# accepts "²" (which int() refuses) and "٣" (which int() reads as 3); int() refuses over
# 4,300 digits; 20 digits overflow a 64-bit column.
NUMBER_TEXTS = {
    "superscript": "²",
    "arabic_indic": "٣",
    "huge": "9" * HUGE_DIGITS,
    "over_64_bits": "9" * 20,
    "negative": "-1",
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


# Hosts no webhook may reach, in the spellings that reach an internal address (issue 31 item
# 9): IPv6 forms that embed an IPv4 address, and the old numeric IPv4 forms, as URL hosts.
INTERNAL_HOSTS = {
    "v4_compatible": "[::127.0.0.1]",
    "v4_compatible_hex": "[::7f00:1]",
    "v4_mapped": "[::ffff:127.0.0.1]",
    "v4_mapped_private": "[::ffff:10.0.0.1]",
    "siit": "[::ffff:0:127.0.0.1]",
    "siit_metadata": "[::ffff:0:169.254.169.254]",
    "nat64": "[64:ff9b::127.0.0.1]",
    "nat64_metadata": "[64:ff9b::a9fe:a9fe]",
    "nat64_local_use": "[64:ff9b:1::127.0.0.1]",
    "6to4": "[2002:7f00:1::]",
    "6to4_private": "[2002:c0a8:101::1]",
    "teredo_loopback_client": "[2001:0:4136:e378:8000:63bf:80ff:fffe]",
    "v6_loopback_long": "[0:0:0:0:0:0:0:1]",
    "v6_unspecified": "[::]",
    "v6_link_local_scoped": "[fe80::1%25eth0]",
    "v6_unique_local": "[fd00::1]",
    "v6_multicast": "[ff02::1]",
    "octal": "0177.0.0.1",
    "hex_dotted": "0x7f.0.0.1",
    "decimal": "2130706433",
    "short": "127.1",
    "octal_private": "012.0.0.1",
    "trailing_dot": "127.0.0.1.",
    "zero_short": "0",
    "broadcast": "255.255.255.255",
    "benchmarking": "198.18.0.1",
}

# Ports outside 1-65535, as they appear in a URL.
BAD_PORTS = ("0", "65536", "99999", "-1")

# JSON bodies that are not UTF-8 without a byte order mark (RFC 8259 §8.1), as raw bytes.
_RUN = '{"agent": "demo", "input": "go"}'
NOT_UTF8_JSON = {
    "utf8_bom": b"\xef\xbb\xbf" + _RUN.encode(),
    "utf16_bom": _RUN.encode("utf-16"),
    "utf16_le": _RUN.encode("utf-16-le"),
    "utf16_be": _RUN.encode("utf-16-be"),
    "utf32_bom": _RUN.encode("utf-32"),
    "utf32_be": _RUN.encode("utf-32-be"),
    "latin1": '{"agent": "demo", "input": "caf\u00e9"}'.encode("latin-1"),
}

# Content-Type headers of a multipart body whose boundary is missing or malformed.
MALFORMED_MULTIPART = (
    "multipart/form-data",
    "multipart/form-data; boundary=",
    'multipart/form-data; boundary="unterminated',
    "multipart/form-data; boundary=a b",
    "multipart/form-data; boundary=" + "b" * 300,
    "multipart/form-data; boundary*=x''%ff",  # RFC 2231, in a charset that does not exist
)
