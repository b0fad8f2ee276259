"""Logs: every logger reaches stderr, with the run, thread, commit, worker and request they
are about; plain lines by default, JSON lines with LOG_FORMAT=json; level from LOG_LEVEL, single
loggers' levels from RUNTIME_LOG_LEVELS.

The subprocess tests run real ``manage.py`` processes, so the LOGGING setting is exercised
exactly as a deployment loads it.
"""

from __future__ import annotations

import json
import logging

import pytest

from runtime import logs
from tests.runtime.support import run_row, text_step

# A request that fails inside a view (the metrics exposition raises), then one error line from
# each server logger; run in a subprocess so that the settings' LOGGING is the one in force.
PROBE = """
import logging
from unittest import mock
from django.test import Client
with mock.patch("runtime.metrics.exposition", side_effect=RuntimeError("boom")):
    response = Client(raise_request_exception=False).get(
        "/metrics", headers={"X-Request-ID": "req-42"}
    )
assert response.status_code == 500, response.status_code
assert response["X-Request-ID"] == "req-42"
logging.getLogger("django.channels.server").error("channels probe")
logging.getLogger("daphne.server").error("daphne probe")
logging.getLogger("runtime.probe").info("info probe")
"""


def _json_lines(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_logs_json_lines_with_run_thread_seq_and_worker(start, worker):
    run_id = start(text_step("hello"))
    code, err = worker(worker_id="w-json", LOG_FORMAT="json", LOG_LEVEL="DEBUG")
    assert code == 0, err
    lines = _json_lines(err)
    commits = [line for line in lines if line["logger"] == "runtime.commit"]
    assert commits, err
    last = commits[-1]
    assert last["run_id"] == run_id
    assert last["thread_id"] == run_row(run_id).thread_id
    assert last["seq"] == run_row(run_id).version
    assert last["worker_id"] == "w-json"
    assert {"time", "level", "message"} <= set(last)
    claimed = next(line for line in lines if "claimed" in line["message"])
    assert (claimed["level"], claimed["worker_id"]) == ("INFO", "w-json")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_logs_plain_lines_by_default(start, worker):
    run_id = start(text_step("hello"))
    code, err = worker(worker_id="w-plain", LOG_FORMAT=None, LOG_LEVEL="DEBUG")
    assert code == 0, err
    commit_lines = [line for line in err.splitlines() if " runtime.commit " in line]
    assert commit_lines, err
    assert f"run_id={run_id}" in commit_lines[-1]
    assert "worker_id=w-plain" in commit_lines[-1]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_request_errors_and_server_loggers_reach_stderr_as_json(command):
    done = command("shell", "-c", PROBE, LOG_FORMAT="json", LOG_LEVEL="INFO")
    assert done.returncode == 0, done.stderr
    lines = _json_lines(done.stderr)
    failed = next(line for line in lines if line["logger"] == "django.request")
    assert failed["level"] == "ERROR"
    assert failed["request_id"] == "req-42"
    assert "boom" in failed.get("exc_info", "")
    loggers = {line["logger"]: line for line in lines}
    assert loggers["django.channels.server"]["message"] == "channels probe"
    assert loggers["daphne.server"]["message"] == "daphne probe"
    assert loggers["runtime.probe"]["level"] == "INFO"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_log_level_hides_lower_records(command):
    done = command("shell", "-c", PROBE, LOG_LEVEL="warning", LOG_FORMAT=None)
    assert done.returncode == 0, done.stderr
    assert "ERROR django.request Internal Server Error: /metrics" in done.stderr
    assert "[request_id=req-42]" in done.stderr
    assert "daphne probe" in done.stderr
    assert "info probe" not in done.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_bad_log_level_or_format_stops_start_up_naming_the_variable(command):
    for name, value in (("LOG_LEVEL", "LOUD"), ("LOG_FORMAT", "xml")):
        done = command("check", **{name: value})
        assert done.returncode != 0
        assert name in done.stderr


# One INFO record from each model client logger and from two runtime loggers.
LEVELS_PROBE = """
import logging
for name in ("httpx", "httpx2", "openai", "anthropic", "runtime.worker", "runtime.probe"):
    logging.getLogger(name).info("probe from %s", name)
logging.getLogger("runtime.worker.loop").debug("debug probe from runtime.worker.loop")
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_model_client_requests_are_quiet_by_default_and_levels_are_set_per_logger(command):
    done = command("shell", "-c", LEVELS_PROBE, LOG_LEVEL="INFO", LOG_FORMAT=None)
    assert done.returncode == 0, done.stderr
    said = {line.rsplit(" ", 1)[-1] for line in done.stderr.splitlines() if "probe from" in line}
    assert said == {"runtime.worker", "runtime.probe"}, done.stderr  # no HTTP request line

    done = command(
        "shell",
        "-c",
        LEVELS_PROBE,
        LOG_LEVEL="INFO",
        LOG_FORMAT=None,
        RUNTIME_LOG_LEVELS=" httpx2=info, runtime.probe=WARNING,runtime.worker=DEBUG ",
    )
    assert done.returncode == 0, done.stderr
    said = {line.rsplit(" ", 1)[-1] for line in done.stderr.splitlines() if "probe from" in line}
    assert said == {"httpx2", "runtime.worker", "runtime.worker.loop"}, done.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_malformed_log_levels_setting_stops_start_up_naming_it(command):
    for value in ("httpx2", "=DEBUG", "httpx2=LOUD"):
        done = command("check", RUNTIME_LOG_LEVELS=value)
        assert done.returncode != 0
        assert "RUNTIME_LOG_LEVELS" in done.stderr and repr(value) in done.stderr, done.stderr


def test_context_is_restored_after_its_block_and_extra_wins():
    record = logging.LogRecord("runtime.x", logging.INFO, __file__, 1, "m", None, None)
    before = dict(logs.current())
    with logs.context(run_id="r1", worker_id="w1", thread_id=None, seq=None, request_id=None):
        logs.bind(thread_id="t1")
        assert {k: v for k, v in logs.current().items() if v} == {
            "run_id": "r1",
            "worker_id": "w1",
            "thread_id": "t1",
        }
        record.run_id = "from-extra"
        logs.ContextFilter().filter(record)
    assert dict(logs.current()) == before
    assert (record.run_id, record.worker_id, record.thread_id) == ("from-extra", "w1", "t1")
    line = logs.PlainFormatter("%(message)s").format(record)
    assert line == "m [run_id=from-extra thread_id=t1 worker_id=w1]"


def test_an_unknown_context_field_is_refused():
    with pytest.raises(ValueError, match="not log context fields"):
        logs.bind(user="x")
