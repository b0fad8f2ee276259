"""OpenTelemetry: one trace per run, with the span tree the issue names, seen by the SDK's
in-memory exporter; nothing at all when no ``OTEL_*`` variable turns tracing on."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from console.management.groups import ensure_groups
from runtime import tracing
from runtime.models import Run
from tests.runtime.support import calls, run_row, text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    yield exporter
    tracing.use_provider(None)
    provider.shutdown()


def _by_name(finished) -> dict[str, list]:
    found: dict[str, list] = {}
    for span in finished:
        found.setdefault(span.name, []).append(span)
    return found


def test_one_trace_per_run_with_steps_inference_and_tool_calls(spans, start, work_inline):
    run_id = start(tool_step(("ledger_replay", {"key": "a"})), text_step("done"))
    work_inline()
    assert run_row(run_id).end_cause == "natural"
    finished = spans.get_finished_spans()
    ours = [s for s in finished if s.context.trace_id == int(run_id, 16)]
    names = _by_name(ours)
    assert Run.objects.get(id=run_id).trace_id == run_id

    (drive,) = names["run.drive"]
    assert drive.attributes["runtime.worker_id"] == "inline"
    step1, step2 = names["step 1"][0], names["step 2"][0]
    assert step1.parent.span_id == drive.context.span_id
    assert step2.parent.span_id == drive.context.span_id

    chat = names["chat default"]
    assert len(chat) == 2
    assert chat[0].parent.span_id == step1.context.span_id
    assert chat[0].attributes["gen_ai.system"] == "scripted"
    assert chat[0].attributes["gen_ai.operation.name"] == "chat"
    assert chat[1].attributes["gen_ai.usage.output_tokens"] == 1

    (gate,) = names["tool.gate"]
    (tool,) = names["execute_tool ledger_replay"]
    (call,) = calls(run_id)
    assert tool.parent.span_id == gate.context.span_id
    assert (
        dict(tool.attributes).items()
        >= {
            "gen_ai.tool.name": "ledger_replay",
            "runtime.operation_id": call.operation_id,
            "runtime.attempt": 1,
            "runtime.policy": "replay",
        }.items()
    )
    (finalize,) = names["batch.finalize"]
    assert finalize.parent.span_id == drive.context.span_id

    # The command that started the run is linked to the run's trace.
    (request,) = [s for s in finished if s.name == "runtime.request"]
    assert request.attributes["runtime.operation"] == "start"
    assert [link.context.trace_id for link in request.links] == [int(run_id, 16)]


def test_a_failed_inference_marks_its_span(spans, start, work_inline):
    run_id = start({"error": "fatal"})
    work_inline()
    (chat,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    assert chat.status.is_ok is False
    assert "scripted fatal error" in chat.status.description
    assert chat.context.trace_id == int(run_id, 16)


def test_off_without_otel_variables(start, work_inline, monkeypatch):
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tracing, "_configured", False)
    run_id = start(text_step())
    work_inline()
    assert tracing.provider() is None
    assert Run.objects.get(id=run_id).trace_id == ""


def test_the_console_links_a_traced_run(spans, start, work_inline, settings):
    settings.RUNTIME_TRACE_URL = "https://tempo.example/trace/{trace_id}"
    run_id = start(text_step())
    work_inline()
    user = get_user_model().objects.create_user(username="tracer", password="pw")
    user.groups.add(ensure_groups()["viewers"])
    client = Client()
    client.force_login(user)
    page = client.get(f"/runs/{run_id}/").content.decode()
    assert f'href="https://tempo.example/trace/{run_id}"' in page
    settings.RUNTIME_TRACE_URL = ""
    assert "tempo.example" not in client.get(f"/runs/{run_id}/").content.decode()


def test_a_worker_process_exports_its_spans_before_it_leaves(start, spawn_worker):
    """A stopped worker leaves with ``os._exit`` (runtime.management.base.leave), which runs
    no exit hook of the SDK: its batched spans are exported first, so the run's trace is
    complete on the exporter (here the console's, on the worker's stdout)."""
    run_id = start(text_step("done"))
    worker = spawn_worker(OTEL_TRACES_EXPORTER="console", OTEL_BSP_SCHEDULE_DELAY="600000")
    code, err = worker.wait()
    assert code == 0, err
    assert err.rstrip().endswith("stopped"), err
    assert run_row(run_id).state == "ended"
    exported = worker.stdout
    for name in ("run.drive", "step 1", "chat default"):
        assert f'"name": "{name}"' in exported, exported[-2000:]
    assert f'"trace_id": "0x{run_id}"' in exported
