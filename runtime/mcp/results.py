"""A CallToolResult as the text the model sees.

Text content stays text; structured content becomes JSON (once: a text block that is already
its JSON serialization is not repeated); images, audio, resource links and embedded resources
are described by kind, type and size, so nothing the server answered is dropped silently.
``isError`` makes the whole text an error result (the model sees it, DESIGN.md "Tools").
"""

from __future__ import annotations

import json
from typing import Any

NO_CONTENT = "(the tool returned no content)"


def result_text(result: Any) -> str:
    """Render a CallToolResult (``content`` blocks, ``structured_content``) as one text."""
    parts = [_block(block) for block in result.content or ()]
    structured = result.structured_content
    if structured is not None and not any(_same_json(part, structured) for part in parts):
        parts.append(json.dumps(structured, sort_keys=True))
    return "\n\n".join(parts) if parts else NO_CONTENT


def _same_json(text: str, value: Any) -> bool:
    try:
        return json.loads(text) == value
    except ValueError:
        return False


def _size(data: str | None) -> str:
    """The decoded size of base64 ``data``, without decoding it."""
    if data is None:
        return "no data"
    return f"{len(data) * 3 // 4 - len(data) + len(data.rstrip('='))} bytes"


def _block(block: Any) -> str:
    kind = getattr(block, "type", "unknown")
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind} content: {block.mime_type}, {_size(block.data)}]"
    if kind == "resource_link":
        return f"[resource link: {block.uri} ({block.name})]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return f"[resource {resource.uri}]\n{text}"
        mime = getattr(resource, "mime_type", None) or "unknown type"
        return f"[resource {resource.uri}: {mime}, {_size(getattr(resource, 'blob', None))}]"
    dumped = block.model_dump(mode="json") if hasattr(block, "model_dump") else str(block)
    return f"[{kind} content: {json.dumps(dumped, sort_keys=True)}]"


def looked_up(result: Any) -> str | None:
    """A reconnect lookup's answer: the earlier result's text, or None when the server says
    it never saw the operation (no content, or structured content ``null``/``{"result":
    null}``). An error result raises LookupError: "unknown" must not read as "not seen"."""
    if result.is_error:
        raise LookupError(result_text(result))
    structured = result.structured_content
    if structured is None and not result.content:
        return None
    if "structured_content" in result.model_fields_set and structured in (None, {"result": None}):
        return None
    return result_text(result)
