"""The runtime's database alias (RUNTIME_DATABASE): its models are routed there by
``runtime.db.Router``, the write path's connection and transactions follow it, and what the
runtime attaches to connections (the re-prepare wrapper that sends DEALLOCATE ALL, the pool's
idle check) touches only its own alias, never a host's other databases."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from django.contrib.auth.models import User

from runtime import db
from runtime.apps import check_pool_together, replan_after_schema_change
from runtime.models import Run


def test_the_router_sends_the_runtimes_models_to_its_alias_and_nothing_else(settings):
    settings.RUNTIME_DATABASE = "runtime"
    router = db.Router()
    assert router.db_for_write(Run) == router.db_for_read(Run) == "runtime"
    assert router.db_for_write(User) is None and router.db_for_read(User) is None
    assert router.allow_migrate("runtime", "runtime") is True
    assert router.allow_migrate("default", "runtime") is False
    assert router.allow_migrate("default", "auth") is None


def test_the_write_path_uses_the_alias(settings):
    settings.RUNTIME_DATABASE = "default"
    assert db.wrapper().alias == "default"
    assert db.connection.alias == "default"
    settings.RUNTIME_DATABASE = "elsewhere"
    assert db.alias() == "elsewhere"


def _connection(alias: str, prepare: int | None = 5) -> Any:
    options = {} if prepare is None else {"prepare_threshold": prepare}
    return SimpleNamespace(
        alias=alias, vendor="postgresql", settings_dict={"OPTIONS": options}, execute_wrappers=[]
    )


def test_deallocate_is_attached_only_to_the_runtimes_preparing_connections(settings):
    settings.RUNTIME_DATABASE = "runtime"
    host, own, unprepared = (
        _connection("default"),
        _connection("runtime"),
        _connection("runtime", prepare=None),
    )
    for connection in (host, own, unprepared):
        replan_after_schema_change(None, connection)
    assert host.execute_wrappers == []
    assert unprepared.execute_wrappers == []
    assert own.execute_wrappers == [db.replan_stale]


def test_a_host_pool_is_left_alone(settings):
    settings.RUNTIME_DATABASE = "runtime"
    test = object()
    host = SimpleNamespace(alias="default", pool=SimpleNamespace(_check=test))
    check_pool_together(None, host)
    assert host.pool._check is test


def test_no_module_of_the_runtime_reaches_the_default_alias_by_name():
    """Every connection and transaction of the runtime goes through ``runtime.db`` (its alias):
    ``django.db.connection`` and a bare ``transaction.atomic()`` are the default alias's, and
    once were used by the run document's snapshot, search and fork (issue 24)."""
    import ast
    from pathlib import Path

    import runtime

    package = Path(runtime.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "db.py" and path.parent == package or "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "django.db":
                found += [f"{path.name}: connection" for a in node.names if a.name == "connection"]
            elif (
                isinstance(node, ast.Attribute)
                and node.attr == "atomic"
                and isinstance(node.value, ast.Name)
                and node.value.id == "transaction"
            ):
                found.append(f"{path.name}:{node.lineno}: transaction.atomic")
    assert found == []
