"""Guards for text the model writes: tool arguments and the JSON schemas of input tickets.

Model output is untrusted. Arguments are parsed as strict JSON of bounded depth holding only
what every database stores: no NaN or infinities, no NUL characters and no lone surrogates in
text or keys (PostgreSQL refuses NUL in text and jsonb; a lone surrogate has no UTF-8
encoding), no integers of more than MAX_INT_DIGITS digits. Text the model writes outside its
arguments (its answer, tool names and ids, and the raw argument text) is made storable by
``storable_text``, which writes what cannot be stored as a ``\\uXXXX`` escape: inside a JSON
string that keeps the arguments' meaning exactly (so they are still refused when parsed), and
elsewhere it keeps the text auditable. A ticket's schema is validated once when the ticket is
opened and then used to check answers with two guards: ``$ref`` is never retrieved (no
network, no files: only references inside the schema resolve), and ``pattern`` runs on the
``regex`` module under a time limit, so a catastrophic expression cannot stall a request.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import regex
from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

MAX_DEPTH = 32  # nesting of objects and arrays in arguments, metadata and schemas
PATTERN_SECONDS = 0.05
MAX_INT_DIGITS = 100  # longer integers are no tool's business (and Python refuses > 4300)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL, and surrogates (never valid alone)


class UntrustedJSONError(ValueError):
    """The text is not JSON we accept (with the reason)."""


def _refuse_constant(name: str) -> Any:
    raise UntrustedJSONError(f"{name} is not JSON")


def text_problem(text: str) -> str | None:
    """Say why ``text`` cannot be stored in a text or JSON column, or return None."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "text may not contain NUL characters"
    return "text must be valid Unicode (no lone surrogates)"


def storable_text(text: str) -> str:
    """Return ``text`` with each NUL character and lone surrogate written as ``\\uXXXX``."""
    return _UNSTORABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def check_storable(value: Any, what: str) -> None:
    """Raise UntrustedJSONError unless every database can store the JSON ``value``.

    Refused: text (values and keys) with NUL or lone surrogates, non-finite floats, and
    nesting deeper than MAX_DEPTH (checked first, without recursion).
    """
    check_depth(value, what)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if (problem := text_problem(item)) is not None:
                raise UntrustedJSONError(f"{what}: {problem}")
        elif isinstance(item, float) and not math.isfinite(item):
            raise UntrustedJSONError(f"{what}: numbers must be finite")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UntrustedJSONError(f"the number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise UntrustedJSONError(f"integers have at most {MAX_INT_DIGITS} digits")
    return int(text)


def depth(value: Any) -> int:
    """How deeply ``value`` nests objects and arrays (a scalar is 0)."""
    stack, deepest = [(value, 0)], 0
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level + 1)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def check_depth(value: Any, what: str) -> None:
    """Raise UntrustedJSONError when ``value`` nests deeper than MAX_DEPTH."""
    if depth(value) > MAX_DEPTH:
        raise UntrustedJSONError(f"{what}: nesting deeper than {MAX_DEPTH} levels")


def parse_json(text: str, what: str = "arguments") -> Any:
    """Parse untrusted JSON text into a value every database stores; raise UntrustedJSONError.

    Refused (the message says which, without echoing the text): invalid JSON, NaN, infinities
    and numbers out of range, integers over MAX_INT_DIGITS digits, nesting deeper than
    MAX_DEPTH (also when it is too deep to parse at all), NUL or lone surrogates in any
    string or key.
    """
    try:
        value = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int
        )
    except UntrustedJSONError:
        raise
    except RecursionError as exc:
        raise UntrustedJSONError(f"{what}: nesting deeper than {MAX_DEPTH} levels") from exc
    except json.JSONDecodeError as exc:
        raise UntrustedJSONError(f"{what}: not valid JSON: {exc}") from exc
    except ValueError as exc:  # e.g. a number Python will not convert
        raise UntrustedJSONError(f"{what}: a value out of range") from exc
    check_storable(value, what)
    return value


def parse_object(text: str) -> dict[str, Any]:
    """Parse the model's argument text into a JSON object (``parse_json``'s rules); raise
    UntrustedJSONError."""
    value = parse_json(text or "{}")
    if not isinstance(value, dict):
        raise UntrustedJSONError("arguments must be a JSON object")
    return value


ID_PATTERN = r"^[0-9A-Za-z_-]{1,64}$"  # every id the runtime issues (uuid hex, slugs)
_ID = re.compile(ID_PATTERN)


def is_id(text: object) -> bool:
    """Whether ``text`` has the shape of an id the runtime issues; anything else names
    nothing, so lookups answer "not found" without sending it to the database."""
    return isinstance(text, str) and _ID.fullmatch(text) is not None


def _search(pattern: str, text: str) -> bool:
    try:
        return regex.search(pattern, text, timeout=PATTERN_SECONDS) is not None
    except TimeoutError as exc:
        raise ValidationError(f"the pattern {pattern!r} took too long to match") from exc
    except regex.error as exc:
        raise ValidationError(f"the pattern {pattern!r} is not a valid expression") from exc


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


# referencing's stub declares its attrs classes with a decorator mypy does not read as a
# dataclass transform, so their keyword arguments look unknown (the two ignores below).
def _no_retrieval(uri: str) -> Any:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


_Validator = validators.extend(Draft202012Validator, {"pattern": _pattern})
_REGISTRY: Registry = Registry(retrieve=_no_retrieval)  # type: ignore[call-arg]


def check_schema(schema: Any) -> None:
    """Refuse a schema we will not check answers against; raise UntrustedJSONError.

    It must be a JSON Schema (2020-12) object, nest at most MAX_DEPTH levels and avoid
    ``patternProperties`` (its expressions would run without the time limit).
    """
    if not isinstance(schema, dict):
        raise UntrustedJSONError("the answer schema must be a JSON object")
    check_depth(schema, "the answer schema")
    if "patternProperties" in json.dumps(schema):
        raise UntrustedJSONError("the answer schema may not use patternProperties")
    try:
        _Validator.check_schema(schema)
    except SchemaError as exc:
        raise UntrustedJSONError(f"the answer schema is invalid: {exc.message}") from exc


def answer_problem(answer: Any, schema: dict[str, Any]) -> tuple[str, list[Any]] | None:
    """Check an answer against a ticket's schema; return the first problem as (message,
    path into the answer), or None when the answer fits."""
    try:
        error = next(_Validator(schema, registry=_REGISTRY).iter_errors(answer), None)
    except (Unresolvable, ValidationError) as exc:
        return f"the answer schema cannot be used: {exc}", []
    if error is None:
        return None
    return error.message, list(error.absolute_path)
