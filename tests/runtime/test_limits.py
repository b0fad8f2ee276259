"""Limits on what runs at once (issue 23, item 2), kept by the database for every worker.

Real worker subprocesses race for the claims: an agent's run limit and a concurrency key hold
across three workers (asserted from the commit log's intervals), a model's concurrency holds
across three workers (asserted by the model server, which counts the requests open at once),
and a provider's 429 with Retry-After pauses the model for every worker.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.utils import timezone

from runtime import limits
from runtime.domain.limits import ModelLimit, RunLimit, Wait
from runtime.models import ModelSlot, Run, ThreadCommit
from runtime.operations import start_run
from tests.model_server import model_server
from tests.runtime.limited_agent import AGENTS, PER_CUSTOMER, RUNS
from tests.runtime.support import assert_log_sound, tool_step, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

# Leases long enough that no heartbeat on a loaded 2-core machine lets one lapse (a lapsed
# lease frees its slot by design), short polls so that a freed slot is taken at once.
WORKER_ENV = {
    "RUNTIME_AGENTS": AGENTS,
    "RUNTIME_LEASE_SECONDS": "10",
    "RUNTIME_HEARTBEAT_SECONDS": "1",
    "RUNTIME_IDLE_POLL_SECONDS": "0.05",
    "RUNTIME_LIMIT_POLL_SECONDS": "0.05",
    "RUNTIME_MODEL_BACKOFF_SECONDS": "0.01",
    "OPENAI_API_KEY": "test",
}


@pytest.fixture
def agents(settings):
    settings.RUNTIME_AGENTS = AGENTS.split(",")


def driven_intervals(run_ids: list[str]) -> dict[str, tuple[float, float]]:
    """Each run's first and last commit by a worker (seconds since the epoch): the run was
    driven, holding its slot, at least over that interval."""
    spans: dict[str, list[float]] = defaultdict(list)
    rows = ThreadCommit.objects.filter(run_id__in=run_ids, actor__startswith="worker:")
    for run_id, at in rows.values_list("run_id", "created_at"):
        spans[run_id].append(at.timestamp())
    return {run_id: (min(times), max(times)) for run_id, times in spans.items()}


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one instant (closed intervals)."""
    events = sorted([(a, 0) for a, _ in intervals] + [(b, 1) for _, b in intervals])
    now = peak = 0
    for _, end in events:
        now += -1 if end else 1
        peak = max(peak, now)
    return peak


def test_200_runs_of_an_agent_limited_to_5_on_3_workers(agents, spawn_worker):
    """Never more than 5 runs driven at once and never two of one customer, from the log's
    commit intervals; all end natural; each customer's runs are driven in start order."""
    customers, total = 20, 200
    script = [tool_step(("ledger_replay", {"key": "k"})), {"text": "done", "delay_ms": 20}]
    run_ids = [
        start_run(
            agent="limited",
            input=f"task {i}",
            metadata={"customer": f"c{i % customers}", "script": {"steps": script}},
        )
        for i in range(total)
    ]
    workers = [
        spawn_worker(max_inflight=20, worker_id=f"limits-{n}", **WORKER_ENV) for n in range(3)
    ]
    for w in workers:
        code, err = w.wait(timeout=240)
        assert code == 0, err
    ended = Counter(Run.objects.filter(id__in=run_ids).values_list("end_cause", flat=True))
    assert ended == {"natural": total}
    spans = driven_intervals(run_ids)
    assert most_at_once(list(spans.values())) <= RUNS
    for c in range(customers):
        mine = run_ids[c::customers]  # this customer's runs, in start order
        assert most_at_once([spans[r] for r in mine]) <= PER_CUSTOMER
        starts = [spans[r][0] for r in mine]
        assert starts == sorted(starts), f"customer c{c}: runs not driven in start order"
    drivers = set(
        ThreadCommit.objects.filter(run_id__in=run_ids, actor__startswith="worker:")
        .values_list("actor", flat=True)
        .distinct()
    )
    assert len(drivers) >= 2, f"only {drivers} drove runs: the workers did not race"
    assert_log_sound(run_ids[0])


def test_a_model_limit_of_2_holds_with_3_workers_racing(agents, spawn_worker):
    total = 12
    with model_server([("ledger_replay", {"key": "m"})]) as server:
        server.latency = 0.1  # long enough that unlimited runs would overlap
        run_ids = [start_run(agent="modeled", input=f"task {i}") for i in range(total)]
        env = {
            **WORKER_ENV,
            "RUNTIME_TEST_MODEL_URL": server.url,
            "RUNTIME_MODEL_LIMITS": '{"m": {"concurrency": 2}}',
        }
        workers = [spawn_worker(max_inflight=10, **env) for _ in range(3)]
        for w in workers:
            code, err = w.wait(timeout=240)
            assert code == 0, err
        assert server.peak == 2, f"{server.peak} requests were open at once"
        assert server.requests == 2 * total
    ended = Counter(Run.objects.filter(id__in=run_ids).values_list("end_cause", flat=True))
    assert ended == {"natural": total}
    assert not ModelSlot.objects.exists()  # every slot was given back


def test_a_429_with_retry_after_pauses_the_whole_model(agents, spawn_worker):
    """The model answers its first request 429 with Retry-After: 2; after that answer no
    worker asks it anything for 2 s, for any run, and the runs waiting say why.

    The other runs' first questions may be on their way already (their slots were taken
    before the 429 came back; a late worker's arrive later on a loaded machine): they are
    answered after ``latency``. Every next question, and the refused one again, comes only
    once the pause is over (unpaused, they would come ~0.3 s after)."""
    total, retry_after = 6, 2.0
    with model_server([("ledger_replay", {"key": "m"})]) as server:
        server.latency = 0.3
        server.throttle(1, retry_after)
        run_ids = [start_run(agent="modeled", input=f"task {i}") for i in range(total)]
        env = {
            **WORKER_ENV,
            "RUNTIME_TEST_MODEL_URL": server.url,
            "RUNTIME_MODEL_LIMITS": '{"m": {"concurrency": 10}}',
        }
        workers = [spawn_worker(max_inflight=10, **env) for _ in range(3)]
        wait_for(
            lambda: Run.objects.filter(waiting__contains="asked for a pause").exists(),
            timeout=60,
            what="a run to wait for the model's pause",
        )
        for w in workers:
            code, err = w.wait(timeout=240)
            assert code == 0, err
    refused = [at for at, status, _ in server.arrivals if status == 429]
    assert len(refused) == 1
    after = [(at - refused[0], kind) for at, _, kind in server.arrivals if at > refused[0]]
    nexts = [delay for delay, kind in after if kind == "tool"]
    assert len(nexts) >= total  # every run's next question
    assert min(nexts) >= retry_after - 0.05, f"asked {min(nexts):.2f} s after the 429"
    # the refused question, asked again once the pause was over
    assert any(kind == "user" and delay >= retry_after - 0.05 for delay, kind in after), after
    ended = Counter(Run.objects.filter(id__in=run_ids).values_list("end_cause", flat=True))
    assert ended == {"natural": total}


# -- the database rules, without workers ------------------------------------------------------


def _leased(run_id: str, *, seconds: float, epoch: int = 1) -> None:
    Run.objects.filter(id=run_id).update(
        lease_owner="w",
        lease_epoch=epoch,
        lease_expires_at=timezone.now() + timedelta(seconds=seconds),
    )


def test_a_lapsed_lease_frees_its_slot_and_a_claim_fills_only_free_slots(agents, start):
    run_limits = {"limited": RunLimit(runs=2)}
    ids = [start(agent="limited", customer="a") for _ in range(4)]
    _leased(ids[0], seconds=30)
    _leased(ids[1], seconds=-1)  # its worker died: the lease lapsed
    assert limits.held(run_limits, timezone.now()) == {("limited", ""): 1}
    picked = limits.claim_limited(run_limits, 10)
    assert picked == [ids[1]]  # the oldest runnable one, for the one free slot


def test_a_model_slot_of_a_lapsed_claim_is_freed_by_the_next_take(agents, start):
    limit = ModelLimit(concurrency=1)
    first, second = start(agent="limited"), start(agent="limited")
    _leased(first, seconds=30)
    _leased(second, seconds=30)
    slot = limits.take_model("m", limit, first, 1)
    assert isinstance(slot, limits.Slot)
    refused = limits.take_model("m", limit, second, 1)
    assert isinstance(refused, Wait) and "1 of 1 inferences" in refused.reason
    _leased(first, seconds=-1)  # the worker asking died
    assert isinstance(limits.take_model("m", limit, second, 1), limits.Slot)
    assert ModelSlot.objects.count() == 1


def test_a_run_waiting_for_a_slot_says_why(agents, start):
    ids = [start(agent="limited", customer="acme") for _ in range(2)]
    _leased(ids[0], seconds=30)
    assert limits.why_waiting(Run.objects.get(id=ids[1])) == (
        "waiting for a slot: agent limited customer='acme', 1 of 1 running"
    )
    assert limits.why_waiting(Run.objects.get(id=ids[0])) == ""


def test_the_cli_and_metrics_show_each_limits_use(agents, start, command, settings):
    from prometheus_client import CollectorRegistry, generate_latest

    from runtime.metrics import LogCollector

    ids = [start(agent="limited", customer="acme") for _ in range(2)]
    _leased(ids[0], seconds=30)
    done = command("runtime_limits", RUNTIME_AGENTS=AGENTS)
    assert done.returncode == 0, done.stderr
    assert "agent limited: 1 of 5 running, 1 waiting" in done.stdout
    registry = CollectorRegistry()
    registry.register(LogCollector())
    text = generate_latest(registry).decode()
    assert 'runtime_limit_runs_running{agent="limited"} 1.0' in text
    assert 'runtime_limit_runs{agent="limited"} 5.0' in text


def _backlog(run_id: str, count: int) -> list[str]:
    """``count`` copies of run ``run_id`` committed before it (cheap: rows, not commits)."""
    committed_at = Run.objects.get(id=run_id).committed_at
    assert committed_at is not None
    first = committed_at - timedelta(hours=1)
    copies = []
    for n in range(count):
        copy = Run.objects.get(id=run_id)
        copy.id = f"{run_id[:20]}{n:012d}"
        copy.committed_at = first + timedelta(milliseconds=n)
        copies.append(copy)
    Run.objects.bulk_create(copies)
    return [c.id for c in copies]


def test_a_backlog_of_one_key_never_hides_another_keys_run(agents, start):
    """600 runnable runs of customer A (one driven, A's slot full), then one of customer B:
    the first claim with a free slot takes B's run, whatever A's backlog."""
    a_run = start(agent="limited", customer="A")
    backlog = _backlog(a_run, 600)
    _leased(backlog[0], seconds=30)
    b_run = start(agent="limited", customer="B")
    run_limits = {"limited": RunLimit(runs=RUNS, key="customer", per_key=PER_CUSTOMER)}
    assert limits.why_waiting(Run.objects.get(id=b_run)) == ""  # nothing holds B back
    assert limits.why_waiting(Run.objects.get(id=backlog[1])) == (
        "waiting for a slot: agent limited customer='A', 1 of 1 running"
    )
    assert limits.claim_limited(run_limits, 5) == [b_run]
    _leased(b_run, seconds=30)
    assert limits.claim_limited(run_limits, 5) == []
    assert limits.why_waiting(Run.objects.get(id=a_run)) == (
        "waiting for a slot: agent limited customer='A', 1 of 1 running"
    )


@pytest.mark.parametrize("value", [True, None, {"a": 1}, 7])
def test_a_key_value_that_is_not_text_names_the_same_key_everywhere(agents, start, value):
    """The claim and ``why_waiting`` read a run's key with one expression: a true, null,
    object or number value holds back a second run of that value, and says so."""
    ids = [start(agent="limited", customer=value) for _ in range(2)]
    _leased(ids[0], seconds=30)
    run_limits = {"limited": RunLimit(runs=RUNS, key="customer", per_key=PER_CUSTOMER)}
    assert limits.claim_limited(run_limits, 5) == []
    why = limits.why_waiting(Run.objects.get(id=ids[1]))
    assert why.startswith("waiting for a slot: agent limited customer=") and why.endswith(
        ", 1 of 1 running"
    ), why


def test_a_429_records_the_pause_before_its_slot_is_free(agents, settings, monkeypatch):
    """The slot of the request answered 429 is freed in the transaction that records the
    model's pause: whoever takes the freed slot finds the pause (no request slips through)."""
    from django.db.models.signals import post_delete

    from runtime.agents import _registry
    from runtime.models import Limit
    from runtime.worker import Worker

    with model_server([("ledger_replay", {"key": "m"})]) as server:
        server.throttle(1, 30.0)
        monkeypatch.setenv("RUNTIME_TEST_MODEL_URL", server.url)
        _registry.cache_clear()  # the modeled agent reads the server's URL when loaded
        settings.RUNTIME_MODEL_LIMITS = {"m": {"concurrency": 1}}
        run_id = start_run(agent="modeled", input="task")
        other = start_run(agent="modeled", input="other")
        _leased(other, seconds=60)  # held by another worker, which asks next
        Run.objects.filter(id=other).update(lease_owner="other")
        seen: list[object] = []

        def freed(sender, instance, **kwargs):  # in the transaction that frees the slot
            seen.append(Limit.objects.get(key="model:m").not_before)
            seen.append(limits.take_model("m", ModelLimit(concurrency=1), other, 1))

        post_delete.connect(freed, sender=ModelSlot, weak=False, dispatch_uid="limfix")
        settings.RUNTIME_IDLE_POLL_SECONDS = 0.05
        worker = Worker(worker_id="inline")
        serving = threading.Thread(target=worker.run)
        serving.start()
        try:
            wait_for(
                lambda: "asked for a pause" in Run.objects.get(id=run_id).waiting,
                timeout=60,
                what="the run to wait for the model's pause",
            )
        finally:
            worker.stop()
            serving.join(timeout=60)
            post_delete.disconnect(sender=ModelSlot, dispatch_uid="limfix")
            _registry.cache_clear()
    assert [status for _at, status, _kind in server.arrivals] == [429]
    assert len(seen) >= 2 and seen[0] is not None, seen
    assert isinstance(seen[1], Wait) and "asked for a pause" in seen[1].reason
    run = Run.objects.get(id=run_id)
    assert "asked for a pause" in run.waiting
