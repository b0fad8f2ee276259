"""Prometheus metrics of the runtime (prometheus_client).

Two kinds, by where the truth lives:

- **Events of this process** (commits and their latency, version conflicts, lease takeovers,
  poison ends, inferences, tool calls) are counters and histograms in the client's default
  registry, bumped by the tiny functions below from the hot path. Each process exposes its
  own: the web process at ``/metrics``, a worker with ``runtime_worker --metrics-port``.
- **State of the log** (runs by state and end cause, open tickets and the oldest one's age,
  unreconciled Indeterminate calls, timers due, workers) is read from the database when
  scraped, by ``LogCollector``: a few indexed aggregate queries, so every process reports the
  same numbers and none has to be kept in step. Only the web process registers it, so one
  scrape target carries it (``register_log_collector``).

Names follow Prometheus conventions: counters end in ``_total``, durations are seconds.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime import tracing
from runtime.errors import VersionConflict

# Commits take milliseconds on SQLite and PostgreSQL; a stuck one takes seconds.
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Model calls stream for seconds to minutes.
INFERENCE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TOOL_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

COMMITS = Counter("runtime_commits_total", "ThreadCommits written by this process.")
COMMIT_SECONDS = Histogram(
    "runtime_commit_duration_seconds",
    "Time to validate and write one ThreadCommit (its transaction included).",
    buckets=COMMIT_BUCKETS,
)
VERSION_CONFLICTS = Counter(
    "runtime_version_conflicts_total",
    "Commits refused because another writer committed first (nothing was written).",
)
LEASE_TAKEOVERS = Counter(
    "runtime_lease_takeovers_total",
    "Claims of a run whose previous owner's lease expired without a release.",
)
POISON_ENDS = Counter(
    "runtime_poison_ends_total",
    "Runs ended as indeterminate after stopping too many workers without a commit.",
)
WORKER_PROBLEM = Gauge(
    "runtime_worker_problem",
    "1 while this process's worker cannot work, by reason (database_unreachable, "
    "pool_exhausted); 0 otherwise.",
    ["reason"],
)
INFLIGHT = Gauge("runtime_worker_inflight_runs", "Runs this process's worker drives now.")
INFERENCE_SECONDS = Histogram(
    "runtime_inference_duration_seconds",
    "One inference attempt, first request to last streamed delta.",
    ["provider", "model"],
    buckets=INFERENCE_BUCKETS,
)
INFERENCE_TOKENS = Counter(
    "runtime_inference_tokens_total",
    "Tokens the provider reported, by direction (input or output).",
    ["provider", "model", "direction"],
)
INFERENCE_ERRORS = Counter(
    "runtime_inference_errors_total",
    "Failed inference attempts; retryable ones are retried within the budget.",
    ["provider", "model", "retryable"],
)
TOOL_SECONDS = Histogram(
    "runtime_tool_duration_seconds",
    "One tool call attempt, as the executor ran it.",
    ["tool", "policy"],
    buckets=TOOL_BUCKETS,
)
TOOL_CALLS = Counter(
    "runtime_tool_calls_total",
    "Tool call attempts by outcome: ok (a result), error (the tool's error result), "
    "failure (unclassified: the pinned recovery policy decides).",
    ["tool", "policy", "outcome"],
)


# -- hot-path hooks (each is one line at its call site) -------------------------------------


def observe_commit[**P, T](fn: Callable[P, T]) -> Callable[P, T]:
    """Decorate the coordinator's ``commit``: count and time each commit that returns, and
    count each VersionConflict it raises (re-raised unchanged)."""

    @functools.wraps(fn)
    def timed(*args: P.args, **kwargs: P.kwargs) -> T:
        started = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except VersionConflict:
            VERSION_CONFLICTS.inc()
            raise
        COMMIT_SECONDS.observe(time.perf_counter() - started)
        COMMITS.inc()
        return result

    return timed


WEBHOOK_ATTEMPTS = Counter(
    "runtime_webhook_deliveries_total",
    "Webhook delivery attempts by outcome: delivered (2xx), retry (failed, due again), "
    "failed (attempts spent, given up).",
    ["outcome"],
)
WEBHOOK_SECONDS = Histogram(
    "runtime_webhook_request_duration_seconds",
    "One webhook request, from sending to the answer or the error.",
    buckets=TOOL_BUCKETS,
)


def webhook_attempted(outcome: str, seconds: float) -> None:
    WEBHOOK_ATTEMPTS.labels(outcome=outcome).inc()
    WEBHOOK_SECONDS.observe(seconds)


def claimed(*, deaths: int) -> None:
    """Record a claim. ``deaths``: the earlier claims since the run's last commit whose worker
    died without releasing the run (``Run.claims - 1 - Run.failures``); a claim after such a
    death took over an expired lease."""
    if deaths > 0:
        LEASE_TAKEOVERS.inc()


def version_conflict() -> None:
    """Count a commit refused before it was written (its expected version was stale)."""
    VERSION_CONFLICTS.inc()


def worker_problem(reason: str) -> None:
    """Record the worker's state: ``reason`` is "" (it works) or one of WORKER_PROBLEM's."""
    for known in ("database_unreachable", "pool_exhausted"):
        WORKER_PROBLEM.labels(known).set(1 if known == reason else 0)


def poison_ended() -> None:
    """Record a run ended as poison (RUNTIME_POISON_CLAIMS exceeded)."""
    POISON_ENDS.inc()


def inference_observed(
    provider: str,
    model: str,
    seconds: float,
    *,
    usage: Mapping[str, Any] | None = None,
    error: bool | None = None,
) -> None:
    """Record one inference attempt of ``seconds``: its token usage (``input_tokens``,
    ``output_tokens``), or ``error`` (True: retryable, False: not) when it failed."""
    model = model or "default"
    INFERENCE_SECONDS.labels(provider, model).observe(seconds)
    if error is not None:
        INFERENCE_ERRORS.labels(provider, model, "true" if error else "false").inc()
    for direction in ("input", "output"):
        count = (usage or {}).get(f"{direction}_tokens")
        if isinstance(count, int) and count > 0:
            INFERENCE_TOKENS.labels(provider, model, direction).inc(count)


async def measure_inference(provider: Any, request: Any, ctx: Any) -> Any:
    """Await ``provider.infer(request, ctx)`` and record it with ``inference_observed``
    (labels: the provider's ``name``, ``request.model``) and in a ``chat MODEL`` span
    (runtime.tracing). Returns its InferenceResult; ModelError and any other exception pass
    through."""
    from runtime.providers.base import ModelError

    started = time.perf_counter()
    name = getattr(provider, "name", type(provider).__name__)
    with tracing.inference_span(name, request.model or "default") as span:
        try:
            result = await provider.infer(request, ctx)
        except ModelError as exc:
            seconds = time.perf_counter() - started
            inference_observed(name, request.model, seconds, error=exc.retryable)
            tracing.failed(span, exc.message)
            raise
        tracing.record_usage(span, result.usage, result.finish_reason)
    inference_observed(name, request.model, time.perf_counter() - started, usage=result.usage)
    return result


def tool_observed(tool: str, policy: str, outcome: str, seconds: float) -> None:
    """Record one tool attempt: ``outcome`` is "ok", "error" or "failure"."""
    TOOL_SECONDS.labels(tool, policy).observe(seconds)
    TOOL_CALLS.labels(tool, policy, outcome).inc()


# -- state of the log, read when scraped ----------------------------------------------------


class LogCollector(Collector):
    """Gauges read from the database at scrape time (see the module docstring).

    Each family is one aggregate query on an index: runs on (state, end_cause), open tickets
    on the partial open-ticket index, Indeterminate calls on the partial index of calls whose
    effect may have started.
    """

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from runtime import inventory, limits, versions

        runs = GaugeMetricFamily(
            "runtime_runs", "Runs by state and end cause.", labels=["state", "end_cause"]
        )
        for (state, cause), count in sorted(inventory.runs_by_state().items()):
            runs.add_metric([state, cause], count)
        yield runs
        tickets = GaugeMetricFamily(
            "runtime_open_tickets", "Open tickets by kind.", labels=["kind"]
        )
        oldest = GaugeMetricFamily(
            "runtime_oldest_open_ticket_age_seconds",
            "Age of the oldest open ticket of each kind.",
            labels=["kind"],
        )
        for kind, (count, age) in sorted(inventory.open_tickets().items()):
            tickets.add_metric([kind], count)
            oldest.add_metric([kind], age)
        yield tickets
        yield oldest
        yield GaugeMetricFamily(
            "runtime_unreconciled_indeterminate_calls",
            "Indeterminate calls whose effect may have started, with no decisive "
            "reconciliation (applied or not applied) recorded.",
            value=inventory.unreconciled_calls().count(),
        )
        yield GaugeMetricFamily(
            "runtime_paused_runs",
            "Runs an operator paused that have not been resumed or ended.",
            value=inventory.paused_runs(),
        )
        yield GaugeMetricFamily(
            "runtime_runs_waiting_for_model",
            "Running runs released to wait for a model that keeps failing retryably (an "
            "outage), until their next try or RUNTIME_MODEL_OUTAGE_SECONDS.",
            value=limits.waiting_for_model(),
        )
        yield GaugeMetricFamily(
            "runtime_timers_due",
            "Open timer tickets whose time has come.",
            value=inventory.timers_due(),
        )
        from runtime import webhooks

        pending, age = webhooks.backlog()
        yield GaugeMetricFamily(
            "runtime_webhook_backlog",
            "Webhook deliveries waiting to be delivered (enabled endpoints).",
            value=pending,
        )
        yield GaugeMetricFamily(
            "runtime_webhook_oldest_pending_age_seconds",
            "Age of the oldest webhook delivery still waiting (0 when none).",
            value=age,
        )
        workers = GaugeMetricFamily(
            "runtime_workers", "Registered workers by status.", labels=["status"]
        )
        for status, count in sorted(inventory.workers_by_status().items()):
            workers.add_metric([status], count)
        yield workers
        unserved = GaugeMetricFamily(
            "runtime_runs_without_a_worker",
            "Running runs that no live worker may drive: none carries their agent, or (with"
            f" RUNTIME_AGENT_VERSION_ROUTING pinned) the version they are on; counted up to"
            f" {versions.COUNT_CAP}.",
            labels=["agent", "agent_version"],
        )
        for agent, version, count, _reason in versions.without_a_worker():
            unserved.add_metric([agent, version], count)
        yield unserved
        yield from limit_families()


def limit_families() -> Iterator[GaugeMetricFamily]:
    """Each limit's bound and use (runtime.limits.usage), as gauges by agent or model."""
    from runtime import limits

    use = limits.usage()
    bound = GaugeMetricFamily(
        "runtime_limit_runs", "An agent's run limit (runs driven at once).", labels=["agent"]
    )
    running = GaugeMetricFamily(
        "runtime_limit_runs_running", "Runs of a limited agent driven now.", labels=["agent"]
    )
    waiting = GaugeMetricFamily(
        "runtime_limit_runs_waiting", "Runs of a limited agent no worker holds.", labels=["agent"]
    )
    for r in use["runs"]:
        if r["runs"] is not None:
            bound.add_metric([r["agent"]], r["runs"])
        running.add_metric([r["agent"]], r["running"])
        waiting.add_metric([r["agent"]], r["waiting"])
    concurrency = GaugeMetricFamily(
        "runtime_limit_model_concurrency",
        "A model's inferences at once, at most.",
        labels=["model"],
    )
    in_flight = GaugeMetricFamily(
        "runtime_limit_model_in_flight", "A limited model's inferences under way.", labels=["model"]
    )
    paused = GaugeMetricFamily(
        "runtime_limit_model_paused_seconds",
        "Seconds until a provider's Retry-After lets a model be asked again (0: not paused).",
        labels=["model"],
    )
    tokens = GaugeMetricFamily(
        "runtime_limit_model_tokens",
        "Requests a model's bucket allows at once now.",
        labels=["model"],
    )
    now = time.time()
    for m in use["models"]:
        if m["concurrency"] is not None:
            concurrency.add_metric([m["model"]], m["concurrency"])
        in_flight.add_metric([m["model"]], m["in_flight"])
        until = m["not_before"].timestamp() - now if m["not_before"] else 0.0
        paused.add_metric([m["model"]], max(until, 0.0))
        if m["tokens"] is not None:
            tokens.add_metric([m["model"]], m["tokens"])
    yield from (bound, running, waiting, concurrency, in_flight, paused, tokens)


_registered = threading.Lock()
_collector: LogCollector | None = None


def register_log_collector() -> None:
    """Add LogCollector to the default registry once per process (idempotent)."""
    global _collector
    with _registered:
        if _collector is None:
            _collector = LogCollector()
            REGISTRY.register(_collector)


def exposition() -> bytes:
    """This process's metrics and the log's gauges, in the Prometheus text format.

    With PROMETHEUS_MULTIPROC_DIR set (the client's multiprocess mode: several server
    processes writing into one directory), the counters of every process are merged.
    """
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(LogCollector())
        return generate_latest(registry)
    register_log_collector()
    return generate_latest(REGISTRY)


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Expose this process's metrics on ``http://addr:port/metrics`` (a daemon thread).

    Raises OSError when the port cannot be bound.
    """
    from prometheus_client import start_http_server

    start_http_server(port, addr=addr)
