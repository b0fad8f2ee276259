"""MkDocs hook: writes the reference pages from the code at every build, so they cannot drift.

Sets Django up with ``console.settings`` (on an in-memory SQLite database: nothing is read or
written) and, on ``on_files``, adds five generated pages to the site:

- ``reference/settings.md``: every numeric ``RUNTIME_*`` setting of ``runtime.conf.NUMBERS``
  with its default and bounds, and the other settings ``runtime.conf`` reads;
- ``reference/commands.md``: every ``runtime_*`` management command, from its own argparse
  parser (``create_parser``), as ``--help`` prints it;
- ``reference/api.md``: every operation of the ninja API's OpenAPI schema;
- ``reference/errors.md``: every ``RuntimeFault`` code with its status and message, and the
  API's own codes for HTTP errors;
- ``reference/metrics.md``: every metric of the runtime's Prometheus registry.

Nothing in the product imports this file; a failure here fails the (strict) build.
"""

from __future__ import annotations

import importlib
import inspect
import io
import os
import pkgutil
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _setup_django() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("DATABASE_URL", "sqlite://:memory:")
    import django

    django.setup()


def _cell(text: Any) -> str:
    """A value made safe for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _number(value: float | None) -> str:
    if value is None:
        return "none"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def settings_page() -> str:
    from runtime import conf

    lines = [
        "# Settings",
        "",
        "Generated from `runtime/conf.py` at each build. Every setting is a Django setting; the",
        "repository's project (`console/settings.py`) reads most of them from environment",
        "variables of the same name. A setting left unset, or set to None, takes its default.",
        "Bounds are checked by the system checks (`manage.py check`, and every command that",
        "serves or works): a value out of bounds stops the process with a message naming the",
        "setting, its bound and the value.",
        "",
        "## Numbers",
        "",
        "| Setting | Default | Minimum | Maximum | Kind | What it is |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for spec in sorted(conf.NUMBERS.values(), key=lambda s: s.name):
        default = spec.default
        shown = (
            _cell((default.__doc__ or "computed").strip()) or "computed"
            if callable(default)
            else _number(default)
        )
        if callable(default):
            shown = "computed (see its description)"
        kind = "integer" if spec.integer else "number"
        lines.append(
            f"| `{spec.name}` | {shown} | {_number(spec.minimum)} | {_number(spec.maximum)} "
            f"| {kind} | {_cell(spec.doc)} |"
        )
    source = inspect.getsource(conf)
    others = sorted(set(re.findall(r'_get\("(RUNTIME_[A-Z_]+)", (.+?)\)', source)))
    lines += [
        "",
        "## Other settings",
        "",
        "| Setting | Default (as `runtime/conf.py` reads it) |",
        "| --- | --- |",
    ]
    for name, default in others:
        if name not in conf.NUMBERS:
            lines.append(f"| `{name}` | `{_cell(default)}` |")
    lines += [
        "",
        f"`RUNTIME_METRICS` is one of {', '.join(f'`{a}`' for a in conf.METRICS_ACCESS)}.",
        "What each one means in practice, and the environment variables of the repository's",
        "own project, are in the how-to guides ([Embed it in a project](../embedding.md)).",
        "",
    ]
    return "\n".join(lines)


def _commands() -> list[tuple[str, str]]:
    """(name, app module) of every runtime_* management command, sorted by name."""
    found = []
    for app in ("runtime", "console"):
        package = importlib.import_module(f"{app}.management.commands")
        for info in pkgutil.iter_modules(package.__path__):
            if info.name.startswith("runtime_"):
                found.append((info.name, f"{app}.management.commands.{info.name}"))
    return sorted(found)


def commands_page() -> str:
    lines = [
        "# Management commands",
        "",
        "Generated at each build from each command's own argparse parser: what",
        "`manage.py <command> --help` prints. Django's common options (`--settings`,",
        "`--pythonpath`, `--traceback`, `--no-color`, `--force-color`, `--verbosity`,",
        "`--skip-checks`) are left out of each listing.",
        "",
    ]
    common = re.compile(
        r"^  (-v \{0,1,2,3\}, )?--(version|verbosity|settings|pythonpath|traceback|no-color|"
        r"force-color|skip-checks)\b"
    )
    for name, module in _commands():
        command = importlib.import_module(module).Command()
        parser = command.create_parser("manage.py", name)
        out = io.StringIO()
        with redirect_stdout(out):
            parser.print_help(out)
        kept, skipping = [], False
        for line in out.getvalue().splitlines():
            if common.match(line):
                skipping = True
                continue
            if skipping and line.startswith("    "):
                continue
            skipping = False
            kept.append(line.rstrip())
        help_text = "\n".join(kept).strip()
        lines += [
            f"## `{name}`",
            "",
            _cell(command.help or ""),
            "",
            "```text",
            help_text,
            "```",
            "",
        ]
    return "\n".join(lines)


def api_page() -> str:
    from console.api.api import api

    schema = api.get_openapi_schema()
    lines = [
        "# HTTP API",
        "",
        f"Generated at each build from the OpenAPI schema of the ninja API "
        f"({_cell(schema['info'].get('title', ''))}, version "
        f"`{schema['info'].get('version', '')}`). A running server serves the same schema at",
        "`/api/v1/openapi.json` and interactive documentation at `/api/v1/docs`. Every error",
        "has one shape: see [Error codes](errors.md).",
        "",
    ]
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            lines += [f"## `{method.upper()} {path}`", ""]
            if op.get("summary"):
                lines += [f"**{_cell(op['summary'])}**", ""]
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            params = op.get("parameters", [])
            if params:
                lines += [
                    "| Parameter | In | Required | Description |",
                    "| --- | --- | --- | --- |",
                ]
                for p in params:
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} "
                        f"| {_cell(p.get('description', ''))} |"
                    )
                lines.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                ref = content.get("schema", {}).get("$ref", "")
                lines += [
                    f"Body: `{media}` {('`' + ref.rsplit('/', 1)[-1] + '`') if ref else ''}",
                    "",
                ]
            statuses = ", ".join(f"`{s}`" for s in op.get("responses", {}))
            if statuses:
                lines += [f"Responses: {statuses}", ""]
    lines += ["## Schemas", ""]
    for name, spec in schema.get("components", {}).get("schemas", {}).items():
        lines += [f"### `{name}`", ""]
        if spec.get("description"):
            lines += [_cell(spec["description"]), ""]
        props = spec.get("properties", {})
        if props:
            required = set(spec.get("required", []))
            lines += ["| Field | Required | Description |", "| --- | --- | --- |"]
            for field, fspec in props.items():
                lines.append(
                    f"| `{field}` | {'yes' if field in required else 'no'} "
                    f"| {_cell(fspec.get('description', ''))} |"
                )
            lines.append("")
    return "\n".join(lines)


def _subclasses[T](cls: type[T]) -> list[type[T]]:
    found: list[type[T]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


def errors_page() -> str:
    # Import every module that defines faults, so each subclass is known.
    for module in ("runtime.errors", "console.api.errors", "console.api.api"):
        importlib.import_module(module)
    from console.api.errors import HTTP_CODES
    from runtime.errors import RuntimeFault

    faults: dict[str, tuple[int, str]] = {}
    classes: list[type[RuntimeFault]] = [RuntimeFault, *_subclasses(RuntimeFault)]
    for cls in classes:
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        faults.setdefault(cls.code, (cls.status, f"{doc} (`{cls.__module__}.{cls.__name__}`)"))
    lines = [
        "# Error codes",
        "",
        "Generated at each build from the runtime's typed faults (`RuntimeFault` and its",
        "subclasses) and the API's codes for plain HTTP errors. Every 4xx and 5xx of the API",
        "has one shape:",
        "",
        "```json",
        '{"error": {"code": "kind_mismatch", "message": "...", "detail": {}}}',
        "```",
        "",
        "`code` is stable. `database_unavailable` comes with `Retry-After`.",
        "",
        "## Faults",
        "",
        "| Code | Status | Meaning |",
        "| --- | --- | --- |",
    ]
    for code, (status, meaning) in sorted(faults.items()):
        lines.append(f"| `{code}` | {status} | {_cell(meaning)} |")
    lines += [
        "",
        "## HTTP errors",
        "",
        "| Code | Status |",
        "| --- | --- |",
    ]
    for status, code in sorted(HTTP_CODES.items()):
        lines.append(f"| `{code}` | {status} |")
    lines.append("")
    return "\n".join(lines)


def metrics_page() -> str:
    from prometheus_client.metrics import MetricWrapperBase

    rows = set()
    for module in ("runtime.metrics", "runtime.webhooks", "runtime.domain.limits"):
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, MetricWrapperBase):
                for family in value.describe():
                    suffix = "_total" if family.type == "counter" else ""
                    doc = _cell(family.documentation)
                    rows.add(f"| `{family.name}{suffix}` | {family.type} | {doc} |")
    lines = [
        "# Metrics",
        "",
        "Generated at each build from the metrics the runtime defines (`runtime/metrics.py` and",
        "its neighbours), as `/metrics` exposes them (access: `RUNTIME_METRICS`, see",
        "[Settings](settings.md)). Histograms are exposed as `_bucket`, `_sum` and `_count`.",
        "",
        "| Metric | Type | What it measures |",
        "| --- | --- | --- |",
        *sorted(rows),
        "",
    ]
    return "\n".join(lines)


PAGES = {
    "reference/settings.md": settings_page,
    "reference/commands.md": commands_page,
    "reference/api.md": api_page,
    "reference/errors.md": errors_page,
    "reference/metrics.md": metrics_page,
}


def on_files(files: Any, config: Any) -> Any:
    """Add the generated reference pages to the site (mkdocs >= 1.6: File.generated)."""
    from mkdocs.structure.files import File

    _setup_django()
    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    return files
