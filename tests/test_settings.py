"""The environment helpers in console.settings: pure tests, no database (one starts
``manage.py`` to see how a bad setting is reported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from console.settings import (
    VAR_DIR,
    env_bool,
    env_database,
    env_list,
    env_mcp_servers,
    env_number,
)
from runtime.checks import choices_and_shapes, heartbeat_within_lease
from runtime.conf import heartbeat_problem

VAR = "RUNTIME_TEST_SETTINGS_VAR"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.delenv("RUNTIME_DB_PREPARE", raising=False)
    monkeypatch.delenv("RUNTIME_DB_POOL_SIZE", raising=False)
    monkeypatch.delenv("RUNTIME_DB_POOL_TIMEOUT", raising=False)


# --- env_bool ------------------------------------------------------------------------------


@pytest.mark.parametrize("default", [True, False])
def test_env_bool_unset_or_empty_gives_default(monkeypatch, default):
    assert env_bool(VAR, default) is default
    monkeypatch.setenv(VAR, "")
    assert env_bool(VAR, default) is default


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "True", "yes", "Yes", "on", "ON", " true "])
def test_env_bool_true_values(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    assert env_bool(VAR, False) is True


@pytest.mark.parametrize("raw", ["0", "false", "FALSE", "no", "No", "off", "OFF", " off\n"])
def test_env_bool_false_values(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    assert env_bool(VAR, True) is False


@pytest.mark.parametrize("raw", ["maybe", "2", "y", "n", "enabled", "tru", " "])
def test_env_bool_rejects_other_values_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured) as excinfo:
        env_bool(VAR, True)
    assert VAR in str(excinfo.value)
    assert repr(raw) in str(excinfo.value)


# --- env_list ------------------------------------------------------------------------------


def test_env_list_unset_gives_default():
    default = ["localhost", "127.0.0.1"]
    assert env_list(VAR, default) == default


def test_env_list_empty_gives_empty_list(monkeypatch):
    monkeypatch.setenv(VAR, "")
    assert env_list(VAR, ["x"]) == []


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a", ["a"]),
        ("a,b", ["a", "b"]),
        (" a , b ,c ", ["a", "b", "c"]),
        ("a,,b,", ["a", "b"]),
        (" , ,", []),
        ("https://x.example:8443,http://y", ["https://x.example:8443", "http://y"]),
    ],
)
def test_env_list_splits_strips_and_drops_blanks(monkeypatch, raw, expected):
    monkeypatch.setenv(VAR, raw)
    assert env_list(VAR, ["default"]) == expected


# --- env_database --------------------------------------------------------------------------


def test_env_database_sqlite_default_options(tmp_path):
    path = tmp_path / "db.sqlite3"
    config = env_database(VAR, f"sqlite:///{path}")
    assert config["ENGINE"] == "django.db.backends.sqlite3"
    assert config["NAME"] == str(path)
    options = config["OPTIONS"]
    assert options["transaction_mode"] == "IMMEDIATE"
    assert options["timeout"] == 30
    assert "journal_mode=WAL" in options["init_command"]
    # Worker subprocesses in tests cannot share an in-memory database: the test DB is a file.
    assert config["TEST"]["NAME"] == str(VAR_DIR / "test.sqlite3")
    assert config["CONN_MAX_AGE"] == 0


def test_env_database_empty_variable_uses_default(monkeypatch, tmp_path):
    monkeypatch.setenv(VAR, "")
    config = env_database(VAR, f"sqlite:///{tmp_path / 'd.sqlite3'}")
    assert config["ENGINE"] == "django.db.backends.sqlite3"
    assert config["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def test_env_database_variable_overrides_default(monkeypatch, tmp_path):
    monkeypatch.setenv(VAR, f"sqlite:///{tmp_path / 'from-env.sqlite3'}")
    config = env_database(VAR, f"sqlite:///{tmp_path / 'default.sqlite3'}")
    assert config["NAME"] == str(tmp_path / "from-env.sqlite3")


@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "pgsql"])
def test_env_database_postgres(monkeypatch, scheme):
    monkeypatch.setenv(VAR, f"{scheme}://alice:s%40cret@db.internal:6543/runtime")
    config = env_database(VAR, "sqlite:///unused.sqlite3")
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert config["NAME"] == "runtime"
    assert config["USER"] == "alice"
    assert config["PASSWORD"] == "s@cret"
    assert config["HOST"] == "db.internal"
    assert config["PORT"] == 6543
    assert config["CONN_MAX_AGE"] == 0
    # The SQLite-only options never leak into a PostgreSQL configuration.
    assert "transaction_mode" not in config.get("OPTIONS", {})
    assert "TEST" not in config
    prepared = {k: v for k, v in config["OPTIONS"].items() if k != "pool"}  # pool: below
    assert prepared == {"server_side_binding": True, "prepare_threshold": 5}


def test_env_database_postgres_without_prepared_statements(monkeypatch):
    monkeypatch.setenv(VAR, "postgres://alice@db.internal:6432/runtime")
    monkeypatch.setenv("RUNTIME_DB_PREPARE", "0")  # behind a pooler in transaction mode
    options = env_database(VAR, "sqlite:///unused.sqlite3").get("OPTIONS", {})
    assert "server_side_binding" not in options and "prepare_threshold" not in options
    monkeypatch.setenv("RUNTIME_DB_POOL_SIZE", "0")  # and a connection per request
    assert "OPTIONS" not in env_database(VAR, "sqlite:///unused.sqlite3")


def test_env_database_postgres_lends_pooled_connections(monkeypatch):
    """Django's pool (psycopg_pool) by default; RUNTIME_DB_POOL_SIZE sizes it, 0 turns it off
    (a connection per request again)."""
    monkeypatch.setenv(VAR, "postgres://db.internal/runtime")
    monkeypatch.delenv("RUNTIME_DB_POOL_SIZE", raising=False)
    config = env_database(VAR, "sqlite:///unused.sqlite3")
    pool = config["OPTIONS"]["pool"]
    assert (pool["min_size"], pool["max_size"]) == (4, 16)
    assert config["CONN_MAX_AGE"] == 0  # Django's pool requires it
    assert config["CONN_HEALTH_CHECKS"] is True
    monkeypatch.setenv("RUNTIME_DB_POOL_SIZE", "2")
    pool = env_database(VAR, "sqlite:///unused.sqlite3")["OPTIONS"]["pool"]
    assert (pool["min_size"], pool["max_size"]) == (2, 2)
    monkeypatch.setenv("RUNTIME_DB_POOL_SIZE", "0")
    assert "pool" not in env_database(VAR, "sqlite:///unused.sqlite3").get("OPTIONS", {})
    monkeypatch.setenv("RUNTIME_DB_POOL_SIZE", "-1")
    with pytest.raises(ImproperlyConfigured, match="RUNTIME_DB_POOL_SIZE"):
        env_database(VAR, "sqlite:///unused.sqlite3")


def test_env_database_postgres_bounds_the_wait_for_a_pooled_connection(monkeypatch):
    """A request waits RUNTIME_DB_POOL_TIMEOUT seconds (5) for a connection, then is 503; a
    failed reconnect gives up as soon, so the next request tries again at once (issue 21)."""
    monkeypatch.setenv(VAR, "postgres://db.internal/runtime")
    pool = env_database(VAR, "sqlite:///unused.sqlite3")["OPTIONS"]["pool"]
    assert (pool["timeout"], pool["reconnect_timeout"]) == (5, 5)
    monkeypatch.setenv("RUNTIME_DB_POOL_TIMEOUT", "2.5")
    pool = env_database(VAR, "sqlite:///unused.sqlite3")["OPTIONS"]["pool"]
    assert (pool["timeout"], pool["reconnect_timeout"]) == (2.5, 2.5)
    for bad in ("0", "-1", "soon", "nan", "301"):
        monkeypatch.setenv("RUNTIME_DB_POOL_TIMEOUT", bad)
        with pytest.raises(ImproperlyConfigured, match="RUNTIME_DB_POOL_TIMEOUT"):
            env_database(VAR, "sqlite:///unused.sqlite3")


@pytest.mark.parametrize(
    "url",
    [
        "mysql://user@localhost/runtime",  # parsed fine, but not a supported engine
        "oracle://user@localhost/runtime",
        "nonsense://x",  # unknown scheme
        "not a url",
        "postgres://user@localhost:notaport/runtime",  # unparsable
    ],
)
def test_env_database_rejects_bad_values_naming_the_variable(monkeypatch, url):
    monkeypatch.setenv(VAR, url)
    with pytest.raises(ImproperlyConfigured) as excinfo:
        env_database(VAR, "sqlite:///unused.sqlite3")
    assert VAR in str(excinfo.value)


# --- the settings module as pytest-django loads it ------------------------------------------


def test_pytest_django_loads_console_settings(settings):
    assert settings.ROOT_URLCONF == "console.urls"
    assert settings.DATABASES["default"]["ENGINE"] in {
        "django_prometheus.db.backends.sqlite3",  # django.db.backends.*, counted for /metrics
        "django_prometheus.db.backends.postgresql",
    }


# --- env_mcp_servers -----------------------------------------------------------------------

SERVERS = [{"name": "files", "command": "mcp-files", "args": ["--root", "/srv"]}]


def test_env_mcp_servers_unset_is_none():
    assert env_mcp_servers(VAR) == []


def test_env_mcp_servers_from_json_text_or_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv(VAR, json.dumps(SERVERS))
    assert env_mcp_servers(VAR) == SERVERS
    path = tmp_path / "servers.json"
    path.write_text(json.dumps(SERVERS))
    monkeypatch.setenv(VAR, str(path))
    assert env_mcp_servers(VAR) == SERVERS


@pytest.mark.parametrize(
    ("raw", "problem"),
    [("[{", "Expecting"), ("/no/such/servers.json", "No such file"), ("{}", "a list")],
)
def test_env_mcp_servers_refuses_naming_the_variable(monkeypatch, raw, problem):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=VAR) as caught:
        env_mcp_servers(VAR)
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("servers", "problem"),
    [
        ([{"name": "x"}], "command"),
        ([{"name": "x", "url": "http://h/mcp", "tools": {"t": {"policy": "reconnect"}}}], "lookup"),
    ],
)
def test_servers_that_do_not_parse_fail_the_check(settings, servers, problem):
    """The settings module reads the JSON; the runtime.E004 check parses the servers."""
    settings.RUNTIME_MCP_SERVERS = servers
    (error,) = choices_and_shapes()
    assert error.id == "runtime.E004" and error.msg.startswith("RUNTIME_MCP_SERVERS: ")
    assert problem in error.msg


def test_a_bad_setting_stops_manage_py_with_one_line(tmp_path):
    env = {**os.environ, "RUNTIME_LEASE_SECONDS": "abc", "RUNTIME_VAR_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr == "error: RUNTIME_LEASE_SECONDS must be a number, got 'abc'\n"


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "NaN"])
def test_env_number_refuses_what_is_not_finite(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=f"{VAR} must be a finite number"):
        env_number(VAR, 15, minimum=0.2)


def test_env_number_refuses_more_than_its_maximum(monkeypatch):
    """A lease of 1e13 s parsed, then overflowed every date it was added to."""
    monkeypatch.setenv(VAR, "1e13")
    with pytest.raises(ImproperlyConfigured, match=f"{VAR} must be at most 86400, got '1e13'"):
        env_number(VAR, 15, minimum=0.2, maximum=86_400)


def test_env_number_says_when_a_whole_number_is_wanted(monkeypatch):
    monkeypatch.setenv(VAR, "2.5")
    with pytest.raises(ImproperlyConfigured, match=f"{VAR} must be a whole number, got '2.5'"):
        env_number(VAR, 3, integer=True)


def test_a_sqlite_file_in_a_missing_folder_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path}/missing/runtime.sqlite3"
    with pytest.raises(ImproperlyConfigured, match=f"folder {tmp_path}/missing does not exist"):
        env_database(VAR, url)


def manage_py(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_var_dir_that_cannot_be_made_stops_manage_py_with_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = manage_py("check", RUNTIME_VAR_DIR=str(blocker / "var"))
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: RUNTIME_VAR_DIR {blocker / 'var'} cannot be made")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"RUNTIME_AGENTS": "no.such.agent"}, "(runtime.E001) RUNTIME_AGENTS: cannot load"),
        (
            {"RUNTIME_AGENTS": "runtime.conf.lease_ttl"},
            "(runtime.E001) RUNTIME_AGENTS: 'runtime.conf.lease_ttl' is a timedelta",
        ),
        (
            {"RUNTIME_AGENTS": "runtime.demo.agent.demo,runtime.demo.agent.demo"},
            "is named 'demo', as an agent before it is",
        ),
        ({"RUNTIME_AGENTS": "sys.exit"}, "cannot load 'sys.exit': SystemExit()"),
    ],
    ids=["missing", "not-an-agent", "two-of-a-name", "exits"],
)
def test_an_agent_that_cannot_load_fails_the_check(tmp_path, env, said):
    done = manage_py("check", RUNTIME_VAR_DIR=str(tmp_path), **env)
    assert done.returncode == 1
    assert said in done.stderr
    assert "Traceback" not in done.stderr


def test_the_version_routing_comes_from_the_environment(tmp_path):
    """RUNTIME_AGENT_VERSION_ROUTING set in the environment reaches runtime.conf: a value it
    does not know stops the check with the choices (issue 34)."""
    done = manage_py("check", RUNTIME_VAR_DIR=str(tmp_path), RUNTIME_AGENT_VERSION_ROUTING="pinnd")
    assert done.returncode == 1
    assert "(runtime.E004) RUNTIME_AGENT_VERSION_ROUTING must be one of drain, pinned" in (
        done.stderr
    )
    pinned = manage_py(
        "shell",
        "-c",
        "from runtime import conf; print(conf.agent_version_routing())",
        RUNTIME_VAR_DIR=str(tmp_path),
        RUNTIME_AGENT_VERSION_ROUTING="pinned",
    )
    assert pinned.stdout.splitlines()[-1] == "pinned", pinned.stderr


def test_a_worker_runs_the_runtimes_checks_alone(tmp_path):
    """runtime_worker runs the runtime's own checks (runtime.checks.TAG) before it claims:
    an agent that cannot load stops it before it claims anything."""
    done = manage_py(
        "runtime_worker", "--until-idle", RUNTIME_VAR_DIR=str(tmp_path), RUNTIME_AGENTS="sys.exit"
    )
    assert done.returncode == 1, done
    assert "(runtime.E001)" in done.stderr and "Traceback" not in done.stderr


def test_no_agent_is_a_warning(tmp_path):
    """A library installed before its host defines an agent: check passes, and says so."""
    done = manage_py("check", RUNTIME_VAR_DIR=str(tmp_path), RUNTIME_AGENTS=",")
    assert done.returncode == 0, done.stderr
    assert "(runtime.W001) RUNTIME_AGENTS names no agent: no run can start" in done.stderr


@pytest.mark.parametrize("command", [("check",), ("runtime_worker", "--until-idle")])
@pytest.mark.parametrize(("heartbeat", "lease"), [("10", "10"), ("20", "10"), ("4", "10")])
def test_a_heartbeat_over_a_third_of_the_lease_is_refused(tmp_path, command, heartbeat, lease):
    """Issue 21 item 10: such a worker's live runs were taken over by a second worker."""
    done = manage_py(
        *command,
        RUNTIME_VAR_DIR=str(tmp_path),
        RUNTIME_LEASE_SECONDS=lease,
        RUNTIME_HEARTBEAT_SECONDS=heartbeat,
    )
    assert done.returncode == 1, done
    assert (
        f"(runtime.E002) RUNTIME_HEARTBEAT_SECONDS ({heartbeat}) must be at most a third of"
        f" RUNTIME_LEASE_SECONDS ({lease})"
    ) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("heartbeat", "lease"), [(5, 15), (0.3, 1), (0.1, 0.3), (10, 30)])
def test_a_heartbeat_of_at_most_a_third_of_the_lease_is_accepted(heartbeat, lease):
    assert heartbeat_problem(heartbeat, lease) is None


def test_the_heartbeat_follows_a_lease_set_alone(tmp_path):
    """Setting only the lease keeps the rule: the heartbeat defaults to a third of it."""
    done = manage_py(
        "shell",
        "-c",
        "from runtime import conf; print(conf.heartbeat_seconds())",
        RUNTIME_VAR_DIR=str(tmp_path),
        RUNTIME_LEASE_SECONDS="6",
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) == 2


def test_the_check_refuses_what_another_settings_module_lets_through(settings):
    """The runtime.E002 check holds the rule where this project's settings module is not the
    one in use (an app installed elsewhere)."""
    settings.RUNTIME_LEASE_SECONDS, settings.RUNTIME_HEARTBEAT_SECONDS = 9, 5
    (error,) = heartbeat_within_lease()
    assert error.id == "runtime.E002" and error.level == checks.ERROR
    assert error.msg.startswith("RUNTIME_HEARTBEAT_SECONDS (5) must be at most a third of")
    settings.RUNTIME_HEARTBEAT_SECONDS = 3
    assert heartbeat_within_lease() == []


# --- runtime.conf: library defaults, bounds checked by the system checks --------------------


@pytest.mark.parametrize(
    ("name", "raw", "said"),
    [
        (
            "RUNTIME_LEASE_SECONDS",
            "1e13",
            "RUNTIME_LEASE_SECONDS must be at most 86400, got 10000000000000.0",
        ),
        ("RUNTIME_POISON_CLAIMS", "0", "RUNTIME_POISON_CLAIMS must be at least 1, got 0"),
        (
            "RUNTIME_WS_MAX_MESSAGE_BYTES",
            "10",
            "RUNTIME_WS_MAX_MESSAGE_BYTES must be at least 1024, got 10",
        ),
        ("RUNTIME_MODEL_RETRIES", "101", "RUNTIME_MODEL_RETRIES must be at most 100, got 101"),
    ],
)
def test_manage_py_check_names_a_value_out_of_bounds(tmp_path, name, raw, said):
    """The bounds are the runtime's (runtime.conf), so a host project gets the same check."""
    done = manage_py("check", RUNTIME_VAR_DIR=str(tmp_path), **{name: raw})
    assert done.returncode == 1, done.stderr
    assert f"(runtime.E003) {said}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_bounds_hold_for_settings_set_in_python(settings):
    from runtime import conf
    from runtime.checks import numbers_within_bounds

    settings.RUNTIME_WORKER_TOOL_THREADS = 2.5
    (error,) = numbers_within_bounds()
    assert error.msg == "RUNTIME_WORKER_TOOL_THREADS must be a whole number, got 2.5"
    with pytest.raises(ImproperlyConfigured, match="RUNTIME_WORKER_TOOL_THREADS must be a whole"):
        conf.worker_tool_threads()


def test_a_library_registers_no_agent_and_refuses_scripts(settings):
    """A host that sets nothing: no demo agent, no scripted runs; this project sets both."""
    from runtime import conf

    assert conf.agent_paths() == ["runtime.demo.agent.demo", "runtime.demo.agent.assistant"]
    assert conf.allow_scripted() is True
    del settings.RUNTIME_AGENTS, settings.RUNTIME_ALLOW_SCRIPTED
    assert conf.agent_paths() == []
    assert conf.allow_scripted() is False


def test_the_database_alias_must_exist_and_be_routed(settings):
    from runtime.checks import database_alias, database_problem

    settings.RUNTIME_DATABASE = "runtime"
    (error,) = database_alias()
    assert error.id == "runtime.E005" and "RUNTIME_DATABASE ('runtime') is no database" in error.msg
    databases = {"default": {}, "runtime": {}}
    assert "add 'runtime.db.Router' to DATABASE_ROUTERS" in str(
        database_problem("runtime", databases, [])
    )
    assert database_problem("runtime", databases, ["runtime.db.Router"]) is None
    assert database_problem("default", databases, []) is None


def test_the_settings_module_imports_no_app_code():
    """console/settings.py reads the environment only: the apps read it, not the reverse."""
    source = (Path(__file__).resolve().parent.parent / "console" / "settings.py").read_text()
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert not [line for line in imports if "runtime" in line or "console" in line], imports


@pytest.mark.parametrize(
    ("hosts", "problem"), [(["10.0.0.0/33"], "not a CIDR"), ([""], "host name or a CIDR")]
)
def test_a_malformed_webhook_allow_list_fails_the_check(settings, hosts, problem):
    from runtime.checks import choices_and_shapes

    settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = hosts
    (error,) = choices_and_shapes()
    assert error.id == "runtime.E004" and error.msg.startswith("RUNTIME_WEBHOOK_ALLOW_HOSTS: ")
    assert problem in error.msg
