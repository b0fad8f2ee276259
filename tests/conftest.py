"""Shared pytest configuration.

pytest-django reads DJANGO_SETTINGS_MODULE (console.settings) from pyproject.toml. Factories
here are fixtures that return functions (STYLE.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.servers import free_port
from tests.subprocesses import DEFAULT_REDIS_URL, redis_url_for_tests, redis_url_of_worker

ROOT = Path(__file__).resolve().parents[1]

# -- the flush after each transactional test: DELETE, and the reference rows stay -----------------


# Tables the database's triggers write when rows of another table are deleted (RunCount,
# migration 0018). Emptied before runtime_run, they would be left holding its DELETE's -1s,
# and the next test would read its counts one short. Django's table list comes from a set,
# so its order changes with the process's hash seed: one xdist worker in two hit this.
EMPTIED_LAST = frozenset({"runtime_runcount"})


def _flush_by_delete() -> None:
    """Make Django's flush (TransactionTestCase's teardown, ~500 tests here) DELETE the rows.

    TRUNCATE of the ~20 tables took 0.5 to 0.9 s per test on PostgreSQL (new files for every
    table and index, whatever they hold); a test leaves a few rows, which DELETE removes in
    ~10 ms. The result is the same: empty tables, sequences untouched (TRUNCATE is issued
    without RESTART IDENTITY here). Every foreign key Django creates is DEFERRABLE INITIALLY
    DEFERRED, so the order of the DELETEs does not matter to them within the flush's
    transaction; it does to the run counts' triggers (EMPTIED_LAST).
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade or not tables:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        ordered = sorted(tables, key=lambda table: table in EMPTIED_LAST)
        deletes = [f"DELETE FROM {style.SQL_FIELD(self.quote_name(t))};" for t in ordered]
        return ["SET CONSTRAINTS ALL DEFERRED;", *deletes]

    setattr(DatabaseOperations, "sql_flush", sql_flush)  # noqa: B010 (a method, on purpose)


# What migrate and its post_migrate signal write, the same rows in every test database: the
# content types (console.access among them, from console/0002) and the permissions on them.
REFERENCE_TABLES = frozenset({"django_content_type", "auth_permission"})


def _after_a_test(options: dict) -> bool:
    """Whether a flush is the one TransactionTestCase runs after each test (``reset_sequences``
    False, no cascade), as opposed to ``manage.py flush`` or a test's own call."""
    return options.get("reset_sequences", True) is False and not options.get("allow_cascade")


def _flush_keeps_reference_rows() -> None:
    """Make the flush after each transactional test leave REFERENCE_TABLES alone and skip the
    post_migrate signal.

    After emptying every table the flush emits post_migrate, whose receivers re-create every
    content type and permission row by row: 20 to 30 ms of CPU per test on SQLite, ~0.4 s on a
    loaded PostgreSQL (a commit each), over ~600 tests. Kept rows make that signal a no-op, so
    it is not sent. Every other table is emptied as before, groups and their permission links
    included (``ensure_groups`` re-creates them); the tables kept reference no other table.
    """
    from django.core.management.commands import flush
    from django.core.management.sql import sql_flush  # what flush calls, by that name

    handle = flush.Command.handle

    def sql_flush_kept(style, connection, reset_sequences=True, allow_cascade=False):
        if not _after_a_test({"reset_sequences": reset_sequences, "allow_cascade": allow_cascade}):
            return sql_flush(style, connection, reset_sequences, allow_cascade)
        tables = connection.introspection.django_table_names(
            only_existing=True, include_views=False
        )
        kept = [t for t in tables if t not in REFERENCE_TABLES]
        return connection.ops.sql_flush(style, kept, reset_sequences=False, allow_cascade=False)

    def handle_kept(self, **options):
        if _after_a_test(options):
            options["inhibit_post_migrate"] = True
        return handle(self, **options)

    setattr(flush, "sql_flush", sql_flush_kept)  # noqa: B010 (a module global, on purpose)
    setattr(flush.Command, "handle", handle_kept)  # noqa: B010 (a method, on purpose)


def pytest_configure(config: pytest.Config) -> None:
    _flush_by_delete()
    _flush_keeps_reference_rows()


# -- PostgreSQL: commits of the test database do not wait for the WAL to reach the disk ---------


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker) -> None:
    """Turn ``synchronous_commit`` off for the test database, for every session that opens on
    it from now on (the test process's and every subprocess's).

    Each commit otherwise waits for a WAL flush (~4 ms here, far more on a loaded machine) and
    the suite commits tens of thousands of times. What a commit makes visible, and to whom,
    is the same either way; only a crash of the PostgreSQL server itself could lose the last
    commits, and no test crashes it.
    """
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            name = connection.ops.quote_name(connection.settings_dict["NAME"])
            cursor.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
        # The next session of this process opens with the new default; so do the pooled ones
        # when settings give PostgreSQL a connection pool (its sessions predate the ALTER).
        connection.close()
        close_pool = getattr(connection, "close_pool", None)
        if close_pool is not None:
            close_pool()


# -- what the run uses: said in the header, per xdist worker --------------------------------------


def _workers(config: pytest.Config) -> list[str]:
    """The xdist worker ids this run starts (``gw0``, ...), or [""] when it runs in-process."""
    if config.getoption("dist", "no") == "no" or not config.getoption("tx", None):
        return [""]
    return [f"gw{i}" for i in range(len(config.getoption("tx")))]


def _shown(url: str) -> str:
    """A URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _test_database(worker: str) -> str:
    """The test database pytest-django creates in that worker (it adds the ``_gwN`` suffix)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    name = (db.get("TEST") or {}).get("NAME") or f"test_{db['NAME']}"
    name = f"{name}_{worker}" if worker else name
    if "sqlite" in db["ENGINE"]:
        path = Path(name)
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else name
    return name


def _label(worker: str) -> str:
    return f" ({worker})" if worker else ""


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say which test database and which Redis database each worker process uses."""
    return _what_the_run_uses(config)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Say the header's lines when ``-q`` hides the header (the README promises them as the
    first lines of any run); ``--no-header`` asks for none."""
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput") or config.getoption("no_header"):
        return
    if reporter.showheader:  # the header says them
        return
    for line in _what_the_run_uses(config):
        reporter.write_line(line)


def _what_the_run_uses(config: pytest.Config) -> list[str]:
    """The lines naming the test database and the Redis database of each worker process."""
    from django.conf import settings

    workers = _workers(config)
    db = settings.DATABASES["default"]
    names = ", ".join(_test_database(w) + _label(w) for w in workers)
    if "sqlite" in db["ENGINE"]:
        where = f"test database: SQLite {names}"
    else:
        where = f"test database: PostgreSQL {names} on {db.get('HOST') or 'localhost'}"
        where += f":{db['PORT']}" if db.get("PORT") else ""
    configured = os.environ.get("RUNTIME_TEST_REDIS_URL")
    urls = ", ".join(
        _shown(redis_url_of_worker(configured or DEFAULT_REDIS_URL, w)) + _label(w) for w in workers
    )
    if configured:
        redis = f"test Redis: {urls} (RUNTIME_TEST_REDIS_URL)"
    else:
        redis = (
            f"test Redis: {urls} for the browser tests; RUNTIME_TEST_REDIS_URL is unset, so the "
            "Redis readiness test skips and the tests with processes that share a channel layer"
            " (e2e, several servers) start a private redis-server"
        )
    lines = [where, redis]
    if workers != [""]:
        lines.append(
            f"xdist: {len(workers)} worker processes, one test database and Redis database each "
            "(-n 0 runs in this process)"
        )
    return lines


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Refuse an xdist mode that would drop tests: the scope modes key their work by node id,
    and schemathesis gives every operation of tests/api/test_fuzz.py the same one (all but one
    would silently not run). scripts/test uses ``--dist worksteal``, which keys by position."""
    dist = node.config.getoption("dist")
    if dist not in ("loadscope", "loadfile", "loadgroup"):
        return
    counts = Counter(ids)
    twice = sorted(nodeid for nodeid, n in counts.items() if n > 1)
    if twice:
        pytest.exit(
            f"--dist {dist} would run only one of the tests that share a node id "
            f"({', '.join(twice)}): use --dist load or worksteal",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


# -- commit-log factories (fixtures that return functions; used by tests/runtime) ----------------
# Models are imported inside the fixtures: this module loads before pytest-django sets Django up.


@pytest.fixture
def make_thread():
    """Return ``make(**metadata) -> thread id``: a new, empty thread (version 0)."""
    from runtime.models import Thread

    def make(**metadata) -> str:
        return Thread.objects.create(metadata=metadata).id

    return make


@pytest.fixture
def make_run(make_thread):
    """Return ``make(thread_id=None, *, run_id=None, **activate_kwargs) -> RunView``: a run
    activated through the commit coordinator (on a new thread unless ``thread_id``)."""
    from runtime.commits import commit
    from runtime.coordinator import read_head
    from tests.domain import drafts

    def make(thread_id: str | None = None, *, run_id: str | None = None, **kwargs):
        thread_id = thread_id or make_thread()
        draft = drafts.activate(read_head(thread_id), run_id or uuid.uuid4().hex, **kwargs)
        return commit(draft).run

    return make


@pytest.fixture
def make_calls():
    """Return ``make(n=1, **call_kwargs) -> tuple[ToolCall, ...]``: a new batch's calls, all
    Requested, with fresh ids (see tests.domain.drafts.make_call for the kwargs)."""
    from tests.domain import drafts

    ids = drafts.Ids()

    def make(n: int = 1, **kwargs):
        return tuple(drafts.make_call(i, ids=ids, **kwargs) for i in range(n))

    return make


@pytest.fixture
def deploy(settings):
    """``deploy("v1")`` makes this process carry that version of the agent ``deploy``
    (tests/runtime/deploy_agents; None: not at all) and returns its deployed version ("" for
    None). The effects the versions' tools recorded in this process are cleared first."""
    from runtime.agents import get_agent
    from tests.runtime import deploy_agents

    base = list(settings.RUNTIME_AGENTS)
    deploy_agents.APPLIED.clear()

    def to(version: str | None) -> str:
        extra = [] if version is None else [f"tests.runtime.deploy_agents.{version}"]
        settings.RUNTIME_AGENTS = [*base, *extra]
        return "" if version is None else get_agent("deploy").deployed_version

    return to


@pytest.fixture
def drive():
    """Return ``drive(build, run_id, *args, **kwargs) -> Committed``: build a commit with a
    tests.domain.drafts builder from the run's committed state and head, and write it."""
    from runtime.commits import commit
    from runtime.coordinator import read_head, read_run

    def apply(build, run_id: str, *args, **kwargs):
        run = read_run(run_id)
        assert run is not None, f"run {run_id} has no committed state"
        return commit(build(read_head(run.thread_id), run, *args, **kwargs))

    return apply


@pytest.fixture
def announcements():
    """The CommitNotices sent on ``runtime.signals.commit_announced`` during the test."""
    from runtime.signals import commit_announced

    heard: list = []

    def receiver(sender, notice, **kwargs):
        heard.append(notice)

    commit_announced.connect(receiver, weak=False)
    yield heard
    commit_announced.disconnect(receiver)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A Redis for the channel layer of subprocesses (workers, servers): RUNTIME_TEST_REDIS_URL
    (this xdist worker's own database), or else a private redis-server on a free port, stopped
    after the test. Skips the test when neither is there."""
    configured = redis_url_for_tests()  # this xdist worker's own database
    if configured:
        yield configured
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip(
            "live deltas across processes need Redis: install redis-server or set "
            "RUNTIME_TEST_REDIS_URL"
        )
    port = free_port()
    with (tmp_path / "redis.log").open("wb") as log:
        redis = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert redis.poll() is None and time.monotonic() < deadline, (
                f"redis-server did not start:\n{(tmp_path / 'redis.log').read_text()}"
            )
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        redis.terminate()
        redis.wait(timeout=10)
