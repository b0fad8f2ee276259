"""OpenTelemetry traces of runs: off unless the standard ``OTEL_*`` variables turn them on.

One trace per run: its trace id is the run id (128 bits of hex), so every worker that ever
drives the run, on any machine and after any crash, adds its spans to the same trace without
passing anything around. Spans:

- ``run.drive`` for each claim of a worker (``driving``), with the worker id;
- ``step N``, ``tool.gate``, ``tool.execute``, ``tool.recover``, ``batch.finalize`` for each
  action the loop takes from the committed frontier (``traced_action``);
- ``chat MODEL`` for each inference attempt, with the GenAI semantic conventions
  (``gen_ai.system``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` / ``output_tokens``);
- ``execute_tool NAME`` for each tool attempt (``gen_ai.tool.name``, ``runtime.operation_id``,
  ``runtime.attempt``, ``runtime.policy``);
- ``runtime.request`` for an operator command (start, resume, cancel) with a link to the
  run's trace, so the API request that started or resumed a run leads to it.

Tracing is on when ``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``) or an
``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` is set and ``OTEL_SDK_DISABLED`` is not true; the
service name and resource come from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``.
Tests install a provider with an in-memory exporter (``use_provider``). Off, every function
here costs one check and does nothing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

_lock = threading.Lock()
_configured = False
_provider: TracerProvider | None = None


def _wanted() -> str | None:
    """The exporter the environment asks for ("otlp" or "console"), or None (off)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return None
    if exporter in ("otlp", "console"):
        return exporter
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return "otlp" if any(os.environ.get(name) for name in endpoints) else None


def switched_on_by() -> str | None:
    """The environment variable that turns tracing on, with its value
    (``"OTEL_TRACES_EXPORTER=console"``), for messages; None when tracing is off."""
    if _wanted() is None:
        return None
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if exporter.lower() in ("otlp", "console"):
        return f"OTEL_TRACES_EXPORTER={exporter}"
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    name = next(name for name in endpoints if os.environ.get(name))
    return f"{name}={os.environ[name]}"


def exporter_kind() -> str | None:
    """The exporter the environment asks for ("otlp" or "console"), or None (tracing off);
    either needs the ``otel`` extra (the OpenTelemetry SDK), which ``runtime.checks`` checks."""
    return _wanted()


def _configure() -> TracerProvider | None:
    exporter_name = _wanted()
    if exporter_name is None:
        return None
    # The SDK is the otel extra's: imported only once tracing is on, so that an install without
    # the extra runs untraced (runtime.checks names the extra when the environment asks for it).
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if exporter_name == "console":
        exporter: Any = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # endpoint, headers, timeout: the OTEL_* variables
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def provider() -> TracerProvider | None:
    """The tracer provider in use, configured from the environment on first use, or None."""
    global _configured, _provider
    if not _configured:
        with _lock:
            if not _configured:
                _provider = _configure()
                _configured = True
    return _provider


def shutdown() -> None:
    """Export the spans still buffered and stop tracing; for a process about to leave with
    ``os._exit``, which runs none of the SDK's own exit hooks (``runtime.management.base``)."""
    if _provider is not None:
        _provider.shutdown()


def use_provider(new: TracerProvider | None) -> None:
    """Trace into ``new`` from now on (None: off). For tests and embedding applications."""
    global _configured, _provider
    with _lock:
        _provider, _configured = new, True


def _tracer() -> trace.Tracer | None:
    current = provider()
    return current.get_tracer("runtime") if current is not None else None


def trace_id_of(run_id: str) -> str:
    """The run's trace id (32 hex digits): the run id itself when it is 32 hex digits (the
    default ids), else the first 128 bits of its SHA-256."""
    try:
        if len(run_id) == 32 and int(run_id, 16):
            return run_id.lower()
    except ValueError:
        pass
    return hashlib.sha256(run_id.encode()).hexdigest()[:32]


def run_context(run_id: str) -> Any:
    """An OpenTelemetry context whose parent is the run's (never exported) root."""
    trace_id = trace_id_of(run_id)
    root = SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(trace_id[:16], 16) or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(root))


def enabled() -> bool:
    """Whether spans are recorded (a tracer is configured)."""
    return _tracer() is not None


def mark_traced(run_id: str) -> None:
    """Record the run's trace id on the run (an operational column, like the lease) the first
    time it is traced (blocking)."""
    from runtime.models import Run

    Run.objects.filter(id=run_id, trace_id="").update(trace_id=trace_id_of(run_id))


@contextmanager
def driving(run_id: str, worker_id: str) -> Iterator[None]:
    """A ``run.drive`` span in the run's trace around one claim (see ``mark_traced``)."""
    tracer = _tracer()
    if tracer is None:
        yield
        return
    attributes = {"runtime.run_id": run_id, "runtime.worker_id": worker_id}
    with tracer.start_as_current_span(
        "run.drive", context=run_context(run_id), attributes=attributes
    ):
        yield


def _action_span(action: Any) -> tuple[str, dict[str, Any]]:
    kind = type(action).__name__
    call = getattr(action, "call", None)
    attributes: dict[str, Any] = {"runtime.action": kind}
    if call is not None:
        attributes |= {"gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.call_id}
    names = {
        "Infer": f"step {getattr(action, 'step', '?')}",
        "Gate": "tool.gate",
        "ExecuteApproved": "tool.execute",
        "RecoverExecuting": "tool.recover",
        "Finalize": "batch.finalize",
        "StepLimit": "run.step_limit",
    }
    return names.get(kind, kind), attributes


def traced_action[**P, T](fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Decorate the loop's ``async act(self, agent, action)``: one span per action taken."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        tracer = _tracer()
        if tracer is None:
            return await fn(*args, **kwargs)
        name, attributes = _action_span(args[-1] if args else kwargs.get("action"))
        with tracer.start_as_current_span(name, attributes=attributes):
            return await fn(*args, **kwargs)

    return wrapper


@contextmanager
def inference_span(system: str, model: str) -> Iterator[Any]:
    """A ``chat MODEL`` span (GenAI semantic conventions); yields it (or None when off) so
    the caller can add the usage with ``record_usage``."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": system,
        "gen_ai.request.model": model,
    }
    with tracer.start_as_current_span(f"chat {model}", attributes=attributes) as span:
        yield span


def record_usage(span: Any, usage: Any, finish_reason: str | None) -> None:
    """Put the token usage and finish reason of an inference on its span (None: nothing)."""
    if span is None:
        return
    for direction in ("input", "output"):
        count = (usage or {}).get(f"{direction}_tokens")
        if isinstance(count, int):
            span.set_attribute(f"gen_ai.usage.{direction}_tokens", count)
    if finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])


@contextmanager
def tool_span(name: str, operation_id: str, attempt: int, policy: str) -> Iterator[Any]:
    """An ``execute_tool NAME`` span for one tool attempt; yields it (or None when off)."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "runtime.operation_id": operation_id,
        "runtime.attempt": attempt,
        "runtime.policy": policy,
    }
    with tracer.start_as_current_span(f"execute_tool {name}", attributes=attributes) as span:
        yield span


def failed(span: Any, description: str) -> None:
    """Mark a span as failed with ``description`` (None span: nothing)."""
    if span is not None:
        span.set_status(Status(StatusCode.ERROR, description))


def request_linked(operation: str, run_id: str, *, actor: str = "") -> None:
    """Record an operator command (``operation``: start, resume, cancel) as a span linked to
    the run's trace, with the request id the log context holds."""
    tracer = _tracer()
    if tracer is None:
        return
    from runtime import logs

    link = Link(trace.get_current_span(run_context(run_id)).get_span_context())
    attributes = {"runtime.operation": operation, "runtime.run_id": run_id, "runtime.actor": actor}
    request_id = logs.current().get("request_id")
    if request_id:
        attributes["http.request.id"] = request_id
    with tracer.start_as_current_span("runtime.request", links=[link], attributes=attributes):
        pass
