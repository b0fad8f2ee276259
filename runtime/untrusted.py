"""Guards for text the model writes: tool arguments and the JSON schemas of input tickets.

Model output is untrusted. Arguments are parsed as strict JSON (no NaN or Infinity, which the
database refuses) of bounded depth. A ticket's schema is validated once when the ticket is
opened and then used to check answers with two guards: ``$ref`` is never retrieved (no
network, no files: only references inside the schema resolve), and ``pattern`` runs on the
``regex`` module under a time limit, so a catastrophic expression cannot stall a request.
"""

from __future__ import annotations

import json
from typing import Any

import regex
from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

MAX_DEPTH = 32  # nesting of objects and arrays in arguments, metadata and schemas
PATTERN_SECONDS = 0.05


class UntrustedJSONError(ValueError):
    """The text is not JSON we accept (with the reason)."""


def _refuse_constant(name: str) -> Any:
    raise UntrustedJSONError(f"{name} is not JSON")


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
        raise UntrustedJSONError(f"{what} nests deeper than {MAX_DEPTH} levels")


def parse_object(text: str) -> dict[str, Any]:
    """Parse the model's argument text into a JSON object; raise UntrustedJSONError."""
    try:
        value = json.loads(text or "{}", parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise UntrustedJSONError(f"arguments are not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise UntrustedJSONError("arguments must be a JSON object")
    check_depth(value, "arguments")
    return value


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


def _no_retrieval(uri: str) -> Any:
    raise NoSuchResource(ref=uri)


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
