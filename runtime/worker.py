"""The worker: claims runnable Runs under a lease, drives them, and wakes promptly.

One event loop drives up to ``max_inflight`` runs at once, each a coroutine (runtime.loop): a
run waiting on its model, an ``async def`` tool, MCP, a pause or a retry holds no thread and no
database connection. The worker's statements run on ``RUNTIME_WORKER_DB_CONNECTIONS`` database
threads and its ``def`` tools on ``RUNTIME_WORKER_TOOL_THREADS`` tool threads, each thread
keeping one connection: the connections a worker holds do not grow with the runs it has in
flight (DESIGN.md "Waiting costs nothing").

A claim is one statement: ``WITH picked AS (SELECT ... FOR UPDATE SKIP LOCKED) UPDATE ...
RETURNING`` on PostgreSQL (the IMMEDIATE write lock on SQLite) that bumps the lease epoch of
up to ``CLAIM_BATCH`` runs and returns everything their drivers need (the committed RunView,
the thread's version and messages, the run's metadata), so a claimed run is driven without
another read. Every commit of the owner is fenced on (owner, epoch), so a stale owner whose
lease expired can write nothing more. Leases are stamped and judged on the database's clock.
One heartbeat, on a thread and connection of its own, renews all the leases the worker holds
in one statement that skips rows locked by a fenced effect or a commit (docs/leases.md).

Poison: a run whose driving raised ``RUNTIME_POISON_CLAIMS`` times without a commit ends as
Ended(indeterminate). A claim lost with its worker (the process died) does not point at the
run, so it counts only toward the much larger ``RUNTIME_POISON_DEATHS`` (like DBOS's
recovery-attempt limit), which still ends a run that keeps killing every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from django.db import InterfaceError
from django.db.models import F, Q
from django.db.models.functions import Greatest
from psycopg_pool import PoolTimeout

from runtime import codec, conf, db, limits, logs, metrics, registry, timers, versions, webhooks
from runtime.coordinator import PAUSED_PREFIX, WAKE_CHANNEL, Lease
from runtime.db import (
    db_later,
    db_now,
    keep_usable,
    reserve_connections,
    size_pool,
    unavailable,
)
from runtime.domain.model import EndCause, RunState
from runtime.errors import LeaseLost
from runtime.loop import Frontier, ModelUnavailable, Services, ThreadPool, WaitForLimit, drive
from runtime.loop.driver import MESSAGE_COLUMNS, committed_message
from runtime.mcp.processes import kill_servers
from runtime.models import MessageRecord, Run, Thread
from runtime.operations import end_run
from runtime.providers import Providers
from runtime.signals import commit_announced

log = logging.getLogger("runtime.worker")

TIMER_CHECK_SECONDS = 1.0  # a worker looks for due timers at most this often
DEFAULT_MAX_INFLIGHT = 100  # runs one worker drives at once (runtime_worker --max-inflight)
# A worker whose event loop has not turned for this long (and a lease) stops renewing its
# leases: it is as good as dead to its runs (a backlog on a loaded machine is far shorter).
LOOP_STALL_SECONDS = 10.0
CLAIM_BATCH = 100  # runs claimed in one statement at most (several workers share a burst)
SERVING: weakref.WeakSet[Worker] = weakref.WeakSet()  # the workers serving in this process


def leave_now(signum: int) -> None:
    """Exit the process at once (a second stop signal): the stdio MCP servers it started are
    killed with their process groups first, or they would outlive it. Never returns."""
    kill_servers()
    os._exit(128 + signum)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Claim:
    run_id: str
    lease: Lease
    claims: int  # claims since the last commit, this one included
    failures: int  # of those, the ones whose driving raised
    frontier: Frontier | None = None


def claim(worker_id: str) -> Claim | None:
    """Take the lease of the oldest runnable run, or return None when none is runnable."""
    taken = claim_many(worker_id, 1)
    return taken[0] if taken else None


def claim_many(worker_id: str, limit: int, driving: tuple[str, ...] = ()) -> list[Claim]:
    """Take the leases of up to ``limit`` runnable runs, oldest first, in one statement;
    return them (empty when none is runnable). Runs other workers hold are skipped, never
    waited for (SKIP LOCKED on PostgreSQL; SQLite has one writer at a time).

    Runs of agents with a run limit are claimed after the others, in a transaction of their
    own that counts their slots under a lock (``runtime.limits.claim_limited``)."""
    ttl = conf.lease_ttl()
    bounded = limits.run_limits()
    mine = versions.Claimable.now()
    if db.connection.vendor == "postgresql":
        claimed = _claim_postgres(worker_id, ttl, limit, mine, driving, exclude=tuple(bounded))
        if bounded and len(claimed) < limit:
            with db.atomic():
                ids = limits.claim_limited(bounded, limit - len(claimed), driving, mine.q())
                if ids:
                    claimed += _claim_postgres(worker_id, ttl, len(ids), mine, driving, ids=ids)
        return claimed
    with db.atomic():  # IMMEDIATE: the write lock is taken at BEGIN
        ids = list(
            Run.objects.runnable(db_now())
            .filter(mine.q())
            .exclude(id__in=driving)
            .exclude(agent__in=list(bounded))
            .order_by("committed_at")
            .values_list("id", flat=True)[:limit]
        )
        if bounded and len(ids) < limit:
            ids += limits.claim_limited(bounded, limit - len(ids), driving, mine.q())
        if not ids:
            return []
        Run.objects.filter(id__in=ids).update(
            lease_owner=worker_id,
            lease_expires_at=db_later(ttl),
            lease_epoch=F("lease_epoch") + 1,
            claims=F("claims") + 1,
            wait_until=None,
            waiting="",
        )
        taken = {row["id"]: row for row in Run.objects.filter(id__in=ids).values(*CLAIMED)}
        heads = dict(
            Thread.objects.filter(id__in=[row["thread_id"] for row in taken.values()]).values_list(
                "id", "version"
            )
        )
        return [
            _claimed(worker_id, ttl, (*row.values(), heads[row["thread_id"]], None))
            for row in (taken[run_id] for run_id in ids)
        ]


CLAIMED = ("id", "thread_id", "lease_epoch", "claims", "failures", "snapshot", "metadata")


def _claim_postgres(
    worker_id: str,
    ttl: Any,
    limit: int,
    mine: versions.Claimable,
    driving: tuple[str, ...] = (),
    *,
    exclude: tuple[str, ...] = (),
    ids: list[str] | None = None,
) -> list[Claim]:
    """One statement: lock up to ``limit`` runnable runs that ``mine`` allows (skipping
    locked ones), take their leases, and return each with its thread's version and committed
    messages (so the driver reads nothing before its first inference). ``exclude`` names
    agents whose runs are left alone; ``ids`` (runs picked under their limits' lock) are the
    only ones taken instead of the oldest."""
    run, thread, message = Run._meta.db_table, Thread._meta.db_table, MessageRecord._meta.db_table
    columns = ", ".join(f"m.{name}" for name in MESSAGE_COLUMNS)
    chosen = "AND NOT (agent = ANY(%s))" if ids is None else "AND id = ANY(%s)"
    allowed, allowed_params = mine.sql()
    with db.connection.cursor() as cursor:
        cursor.execute(
            f"WITH picked AS (SELECT id FROM {run} WHERE state = 'running' AND NOT paused "
            "  AND (lease_expires_at IS NULL OR lease_expires_at < now()) "
            "  AND (wait_until IS NULL OR wait_until <= now()) "
            f"  AND ({allowed}) "
            f"  AND NOT (id = ANY(%s)) {chosen} ORDER BY committed_at LIMIT %s "
            "  FOR UPDATE SKIP LOCKED) "
            f"UPDATE {run} AS r SET lease_owner = %s, lease_expires_at = now() + %s, "
            "lease_epoch = r.lease_epoch + 1, claims = r.claims + 1, wait_until = NULL, "
            "waiting = '' "
            f"FROM picked, {thread} AS t WHERE r.id = picked.id AND t.id = r.thread_id "
            "RETURNING r.id, r.thread_id, r.lease_epoch, r.claims, r.failures, r.snapshot, "
            f"r.metadata, t.version, (SELECT coalesce(jsonb_agg(jsonb_build_array({columns}) "
            f"ORDER BY m.seq, m.idx), '[]') FROM {message} AS m WHERE m.thread_id = r.thread_id)",
            [
                *allowed_params,
                list(driving),
                list(exclude) if ids is None else ids,
                limit,
                worker_id,
                ttl,
            ],
        )
        rows = cursor.fetchall()
    return [_claimed(worker_id, ttl, row) for row in rows]


def _claimed(worker_id: str, ttl: Any, row: tuple[Any, ...]) -> Claim:
    run_id, _thread, epoch, claims, failures, snapshot, metadata, version, messages = row
    metrics.claimed(deaths=claims - 1 - failures)
    if isinstance(snapshot, str):  # a raw cursor on PostgreSQL hands jsonb over as text
        snapshot, metadata = json.loads(snapshot), json.loads(metadata)
    if isinstance(messages, str):
        messages = json.loads(messages)
    return Claim(
        run_id,
        Lease(worker_id=worker_id, epoch=epoch, ttl=ttl),
        claims,
        failures,
        Frontier(
            run=codec.load_run(snapshot),
            version=version,
            metadata=metadata or {},
            messages=None if messages is None else [committed_message(m) for m in messages],
        ),
    )


def release(
    lease: Lease, run_id: str, *, failed: bool = False, wait: WaitForLimit | None = None
) -> None:
    """Give a still-Running run back (the worker stops, its driving failed, or it waits for
    a model's budget or for a model that keeps failing: ``wait``, not claimed again before
    then).

    A graceful stop or a wait takes its claim back from the poison budget (rolling restarts
    never end a healthy run as poison); a failure is counted as one that points at the run.
    """
    fields: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}
    if wait is not None:
        fields.update(wait_until=db_later(wait.delay), waiting=wait.reason[:300])
    if isinstance(wait, ModelUnavailable):
        fields["model_unavailable_since"] = wait.since
    if failed:
        fields["failures"] = F("failures") + 1
    else:
        fields["claims"] = Greatest(F("claims") - 1, 0)
    Run.objects.filter(
        id=run_id, state="running", lease_owner=lease.worker_id, lease_epoch=lease.epoch
    ).update(**fields)


def trouble(exc: BaseException) -> tuple[str, str] | None:
    """What a failure says of the worker's ability to work: ("pool_exhausted" or
    "database_unreachable", one line), or None when it is not a connection problem (a run's
    or the code's own). Which failures are the database's is ``runtime.db.unavailable``'s
    rule, the same the API answers 503 by; this only tells the worker's two states apart."""
    if not unavailable(exc):
        return None
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    if isinstance(exc.__cause__, PoolTimeout) or "too many clients" in line:
        return "pool_exhausted", f"no database connection to be had: {line}"
    if isinstance(exc, InterfaceError) or connection_lost(exc):
        return "database_unreachable", f"the database cannot be reached: {line}"
    return None


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection failed or broke (not a statement's own error)."""
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
    return sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03") or not sqlstate


def renew(held: dict[str, Lease]) -> tuple[set[str], set[str], set[str]]:
    """Renew the leases in ``held`` (run id -> lease) without waiting on any lock; return the
    ids this worker still owns, those of them an operator paused, and those another worker
    took over (claimed: a new lease epoch). A run in none of them left Running (its own last
    commit, or an operator's cancel behind its owner's back). A paused run keeps its lease
    until its driver lets it go: the call in flight finishes and its result is committed
    (README, "Pause").

    On PostgreSQL the renewal skips rows another transaction holds locked (a fenced effect or
    a commit of the run, which renews the lease itself; a peer's claim skips such a row too)
    and gives up on any other lock after a heartbeat (``lock_timeout``): a skipped run is
    still owned and is renewed at the next beat. Raises the database's error (OperationalError
    for a timeout) when the beat could not be made."""
    if not held:
        return set(), set(), set()
    if db.connection.vendor == "postgresql":
        rows = _renew_postgres(held)
    else:
        owned = Q()
        for run_id, lease in held.items():
            owned |= Q(id=run_id, lease_owner=lease.worker_id, lease_epoch=lease.epoch)
        mine = Run.objects.filter(owned, state="running")
        mine.update(lease_expires_at=db_later(conf.lease_ttl()))
        rows = list(mine.values_list("id", "paused"))
    mine_now = {run_id for run_id, _ in rows}
    gone = held.keys() - mine_now
    # Rare (a run that just ended, or was taken over): one primary-key read of those.
    epochs = dict(Run.objects.filter(id__in=gone).values_list("id", "lease_epoch")) if gone else {}
    taken = {run_id for run_id in gone if epochs.get(run_id) != held[run_id].epoch}
    return mine_now, {run_id for run_id, paused in rows if paused}, taken


def _renew_postgres(held: dict[str, Lease]) -> list[tuple[str, bool]]:
    run = Run._meta.db_table
    ids, epochs = list(held), [lease.epoch for lease in held.values()]
    owner = next(iter(held.values())).worker_id  # one worker's leases
    mine = (
        f"SELECT r.id, r.paused FROM {run} AS r "
        "JOIN unnest(%s::varchar[], %s::bigint[]) AS h(id, epoch) "
        "  ON r.id = h.id AND r.lease_epoch = h.epoch "
        "WHERE r.lease_owner = %s AND r.state = 'running'"
    )
    wait = max(1, int(conf.heartbeat_seconds() * 1000))
    with db.atomic(), db.connection.cursor() as cursor:
        # SET LOCAL: only this transaction; the connection serves nothing else anyway.
        cursor.execute(f"SET LOCAL lock_timeout = {wait}")
        cursor.execute(f"SET LOCAL statement_timeout = {max(wait, 1000)}")
        cursor.execute(
            f"WITH free AS ({mine} FOR UPDATE OF r SKIP LOCKED) "
            f"UPDATE {run} AS r SET lease_expires_at = now() + %s FROM free WHERE r.id = free.id",
            [ids, epochs, owner, conf.lease_ttl()],
        )
        renewed = cursor.rowcount
        # A plain read sees the committed owner of the rows skipped above, without a lock.
        cursor.execute(mine, [ids, epochs, owner])
        rows = cursor.fetchall()
    if renewed < len(rows):
        skipped = len(rows) - renewed
        log.info("heartbeat: %d of %d runs locked; renewed at the next beat", skipped, len(rows))
    return rows


def problems() -> list[str]:
    """Why each worker serving in this process cannot work now (empty while they all can):
    the in-process worker's part of ``/readyz``."""
    return [f"{w.worker_id}: {w.problem[1]}" for w in list(SERVING) if w.problem]


@dataclass(slots=True)
class Held:
    """A run this worker drives: its lease, and the events that stop its driver (``halt``:
    the worker stops; with ``release``: the run was released; with ``pause``: an operator
    paused it)."""

    lease: Lease
    halt: asyncio.Event
    release: asyncio.Event
    pause: asyncio.Event


class Worker:
    """Drives up to ``max_inflight`` runs at once until stopped (or idle, with until_idle).

    ``run()`` serves on an event loop of its own in the calling thread and returns once
    stopped (``shares_process``: the process also serves requests, whose connections the
    worker's pool keeps room for); ``stop()`` (from any thread, or a signal handler) asks
    every driver to finish its current boundary. ``step()`` claims and drives one run on the
    calling thread instead.
    """

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        until_idle: bool = False,
        shares_process: bool = False,
    ) -> None:
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be at least 1, got {max_inflight}")
        self.worker_id = worker_id or default_worker_id()
        self.max_inflight = max_inflight
        self.until_idle = until_idle
        self.shares_process = shares_process  # with a server's requests (runtime_serve)
        self.stopping = threading.Event()
        self.turned = time.monotonic()  # when the event loop last ran _turning (the heartbeat's)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.wake = asyncio.Event()
        self.held: dict[str, Held] = {}
        self.drivers: set[asyncio.Task[None]] = set()
        self.timers_checked = 0.0  # time.monotonic() of the last look for due timers
        self.problem: tuple[str, str] | None = None  # (reason, line) while it cannot work
        self.reported: tuple[str, str] | None = None  # what its registry row says
        self.limited = False  # some agent has a run limit: a run's end may free a slot

    # -- signals of new work and of the stop ----------------------------------------------

    def stop(self) -> None:
        """Stop after the current boundaries (thread-safe; also from a signal handler)."""
        self.stopping.set()
        self._call_soon(self._halt_all)

    def _call_soon(self, fn: Any) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(fn)

    def _halt_all(self) -> None:
        for held in self.held.values():
            held.halt.set()
        self.wake.set()

    def _on_commit(self, sender, notice, **kwargs) -> None:
        if notice.runnable:
            self._call_soon(self.wake.set)
        if notice.paused and notice.run_id:
            self._call_soon(partial(self._let_go, notice.run_id))

    def _noticed(self, payload: str) -> None:
        """A NOTIFY on WAKE_CHANNEL: a run was paused (let it go) or became runnable (wake)."""
        if payload.startswith(PAUSED_PREFIX):
            self._let_go(payload.removeprefix(PAUSED_PREFIX))
        else:
            self.wake.set()

    def _let_go(self, run_id: str) -> None:
        """An operator paused ``run_id`` (a committed pause): if this worker drives it, its
        driver stops at its next boundary and releases it (an inference is cancelled). Told
        by the pause's notice, or by the heartbeat when a notice was missed."""
        if (held := self.held.get(run_id)) is not None and not held.pause.is_set():
            log.info("run %s: paused by an operator; letting it go", run_id)
            held.pause.set()
            held.halt.set()

    async def _listen_postgres(self) -> None:
        """Wake on NOTIFY from any process's commit (PostgreSQL only); reconnect after a
        failure, polling meanwhile."""
        import psycopg

        params = db.connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        while not self.stopping.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(
                    **params, autocommit=True
                ) as listener:
                    await listener.execute(f"LISTEN {WAKE_CHANNEL}")
                    async for notice in listener.notifies():
                        self._noticed(notice.payload)
            except Exception:
                log.warning("LISTEN failed; polling until it reconnects", exc_info=True)
                await asyncio.sleep(conf.heartbeat_seconds())

    # -- serving ----------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stopped, or until idle with ``until_idle``; blocks the caller."""
        asyncio.run(self.serve())

    async def serve(self) -> None:
        logs.bind(worker_id=self.worker_id)  # the drivers' tasks inherit it
        SERVING.add(self)
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        self.limited = bool(limits.run_limits())
        pool = ThreadPool(conf.worker_db_connections(), "db")
        tools = ThreadPool(conf.worker_tool_threads(), "tools")
        # Each of those threads keeps a connection for its whole life: the pool holds as many
        # (more for the requests of a server that the worker runs in).
        if self.shares_process:
            reserve_connections(pool.size + tools.size + 1)
        else:
            size_pool(pool.size + tools.size + 1)
        services = Services(db=pool.run, tools=tools, providers=Providers())
        commit_announced.connect(self._on_commit, weak=False, dispatch_uid=id(self))
        # Registered before the worker claims anything, so a held run always names a known
        # worker.
        await self._registry(services, registry.register, self.worker_id, self.max_inflight)
        await self._registry(services, registry.forget_expired)
        # The heartbeat's thread keeps one more connection: its beats queue behind nothing.
        beats, stop_beats = ThreadPool(1, "heartbeat"), threading.Event()
        background = [asyncio.wrap_future(beats.submit(self._heartbeats, stop_beats))]
        background.append(asyncio.ensure_future(self._turning()))
        # Webhook deliveries: a task of their own beside the runs, never on a run's path.
        background.append(
            asyncio.ensure_future(webhooks.Deliverer(self.worker_id, pool.run).serve())
        )
        if db.connection.vendor == "postgresql":
            background.append(asyncio.ensure_future(self._listen_postgres()))
        try:
            await self._claim_loop(services)
        finally:
            self._halt_all()
            await asyncio.gather(*self.drivers, return_exceptions=True)
            stop_beats.set()
            for task in background[1:]:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            beats.close()
            commit_announced.disconnect(dispatch_uid=id(self))
            # A stopping worker is not held up by a busy database: unrecorded, it turns
            # stale instead of stopped.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._registry(services, registry.stopped, self.worker_id), 2
                )
            await services.providers.close()
            pool.close()
            tools.close()
            SERVING.discard(self)

    async def _claim_loop(self, services: Services) -> None:
        while not self.stopping.is_set():
            self.wake.clear()  # before the claim: a wake meanwhile is kept for the wait below
            try:
                taken = await self._claim(services)
                self.observe(None)
                fired = await self._fire_timers(services, now=not taken and self.until_idle)
                if taken or fired:
                    continue
                if self.until_idle and not self.drivers and await services.db(self.idle):
                    return
            except Exception as exc:  # a DB blip in a claim or a timer: the loop lives on
                if not self.observe(exc):
                    log.exception("worker loop: a claim failed; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), conf.idle_poll_seconds())

    async def _claim(self, services: Services) -> bool:
        """Claim runs for the free slots and start their drivers; True when the batch was
        full (more may be runnable)."""
        free = min(self.max_inflight - len(self.drivers), CLAIM_BATCH)
        if free <= 0:
            return False
        # Never its own runs: a lease that lapsed while its driver still works (a heartbeat
        # late on a loaded machine) is renewed by the next beat, not claimed again.
        taken = await services.db(claim_many, self.worker_id, free, tuple(self.held))
        for claimed in taken:
            log.info("run %s: claimed (epoch %s)", claimed.run_id, claimed.lease.epoch)
            task = asyncio.ensure_future(self._drive(claimed, services))
            self.drivers.add(task)
            task.add_done_callback(self._driven)
        metrics.INFLIGHT.set(len(self.drivers))
        return len(taken) == free

    def _driven(self, task: asyncio.Task[None]) -> None:
        full = len(self.drivers) >= self.max_inflight
        self.drivers.discard(task)
        metrics.INFLIGHT.set(len(self.drivers))
        # A slot to claim for, maybe idle, or a limit's slot freed for a run that waits.
        if full or not self.drivers or self.limited:
            self.wake.set()

    async def _fire_timers(self, services: Services, *, now: bool = False) -> int:
        """Fire due timers if TIMER_CHECK_SECONDS passed since the last look (or ``now``);
        return how many fired."""
        if not now and time.monotonic() < self.timers_checked + TIMER_CHECK_SECONDS:
            return 0
        self.timers_checked = time.monotonic()
        return int(await services.db(timers.fire_due))

    def _heartbeats(self, stop: threading.Event) -> None:
        """Every RUNTIME_HEARTBEAT_SECONDS until ``stop``: renew the held leases (releasing the
        drivers of runs whose lease could not be renewed) and the worker's registry row.

        Runs on a thread and connection of its own: a beat never waits for the event loop
        (however many runs it drives), for the database threads' queue, or for a row lock a
        tool or a commit holds (``renew``)."""
        forgot_at = time.monotonic()  # serve() forgot just now
        beat = conf.heartbeat_seconds()
        due = time.monotonic() + beat
        while not stop.wait(max(0.0, due - time.monotonic())):
            due = max(due + beat, time.monotonic())  # a late beat does not shift the next ones
            keep_usable()
            self._beat()
            self._write_registry(registry.heartbeat, self.worker_id)
            if self.reported != self.problem:  # written once a connection allows
                reason = self.problem[1] if self.problem else ""
                if self._write_registry(registry.report, self.worker_id, reason):
                    self.reported = self.problem
            if time.monotonic() >= forgot_at + registry.FORGET_EVERY_SECONDS:
                forgot_at = time.monotonic()
                self._write_registry(registry.forget_expired)

    async def _turning(self) -> None:
        """Note every heartbeat that the event loop still turns: the heartbeat's thread renews
        the leases of the runs it drives only while it does."""
        while True:
            self.turned = time.monotonic()
            await asyncio.sleep(conf.heartbeat_seconds())

    def _beat(self) -> None:
        """One renewal of the held leases (on the heartbeat's thread); the drivers to stop
        or let go are told on the event loop. A loop that has not turned for a lease (and
        LOOP_STALL_SECONDS) drives nothing: its runs' leases are left to lapse."""
        stalled = time.monotonic() - self.turned
        if stalled > max(conf.lease_ttl().total_seconds(), LOOP_STALL_SECONDS):
            log.error("worker %s: its event loop stalled for %.0f s", self.worker_id, stalled)
            return
        held = {run_id: h.lease for run_id, h in self.held.copy().items()}
        try:
            renewed, paused, taken = renew(held)
        except Exception as exc:  # a DB blip or a timeout: the next beat tries again
            if not self.observe(exc):
                log.warning("heartbeat failed; retrying at the next beat", exc_info=True)
            return
        self.observe(None)
        for run_id in held.keys() - renewed:
            self._call_soon(partial(self._lost, run_id, held[run_id], run_id in taken))
        for run_id in paused:
            self._call_soon(partial(self._let_go, run_id))

    def _lost(self, run_id: str, lease: Lease, taken: bool) -> None:
        """Stop the driver of a run this worker no longer owns: ``taken`` over by another
        worker (a warning: a live worker should never lose one), or no longer Running (its
        own last commit, just before the heartbeat read it, or an operator's cancel)."""
        if (lost := self.held.get(run_id)) is not None and lost.lease == lease:
            if taken:
                log.warning("run %s: lease lost; another worker took the run over", run_id)
            else:
                log.info("run %s: ended by another writer (or by its own last commit)", run_id)
            lost.release.set()
            lost.halt.set()

    def _write_registry(self, write: Any, *args: Any) -> bool:
        """Write to the worker's registry row here (the heartbeat's thread); False when it
        failed (logged, never raised: the registry is for operators, it never stops a
        worker)."""
        try:
            write(*args)
        except Exception as exc:
            if not self.observe(exc):
                log.warning("worker %s: registry write failed", self.worker_id, exc_info=True)
            return False
        return True

    async def _registry(self, services: Services, write: Any, *args: Any) -> bool:
        """Write to the worker's registry row; False when it failed (logged, never raised:
        the registry is for operators, it never stops a worker)."""
        try:
            await services.db(write, *args)
        except Exception as exc:
            if not self.observe(exc):
                log.warning("worker %s: registry write failed", self.worker_id, exc_info=True)
            return False
        return True

    def observe(self, failure: BaseException | None) -> bool:
        """Note that the database worked (None) or what ``failure`` says of it; True when
        ``failure`` is a connection problem. A change of state is one log line, a metric, and
        (at the next heartbeat a connection allows) the registry row's ``problem``."""
        if failure is None:
            found = None
        elif (found := trouble(failure)) is None:
            return False
        if (found and found[0]) != (self.problem and self.problem[0]):
            if found:
                log.error("worker %s cannot work: %s", self.worker_id, found[1])
            else:
                log.warning("worker %s works again", self.worker_id)
            metrics.worker_problem(found[0] if found else "")
        self.problem = found
        return found is not None

    # -- one run ----------------------------------------------------------------------------

    async def _drive(self, taken: Claim, services: Services) -> None:
        run_id = taken.run_id
        try:
            if await services.db(self._poisoned, taken):
                return
        except Exception:
            log.exception("run %s: the poison check failed; the run is left to recovery", run_id)
            return
        held = Held(taken.lease, asyncio.Event(), asyncio.Event(), asyncio.Event())
        if self.stopping.is_set():
            held.halt.set()
        self.held[run_id] = held
        failed, left, wait = False, None, None
        try:
            left = await drive(
                run_id,
                lease=taken.lease,
                services=services,
                halt=held.halt,
                release=held.release,
                pause=held.pause,
                frontier=taken.frontier,
            )
        except LeaseLost:
            log.warning("run %s: fenced; another worker owns it now", run_id)
        except WaitForLimit as exc:  # released below: it holds nothing while it waits
            log.info("run %s: %s", run_id, exc.reason)
            wait = exc
        except Exception as exc:  # counted by the poison budget: the next claim starts over
            if self.observe(exc):  # the database's trouble, not the run's: not counted
                log.warning("run %s: left to recovery: %s", run_id, exc)
            else:
                log.exception("run %s: driving failed; the run is left to recovery", run_id)
                failed = True
        finally:
            self.held.pop(run_id, None)
        # An ended or awaiting run gave its lease up in its last commit; only a run left
        # Running (a stop, a failure) is released here.
        if left is None or left.state is RunState.RUNNING:
            try:
                await services.db(release, taken.lease, run_id, failed=failed, wait=wait)
            except Exception:  # the lease expires by itself
                log.warning("run %s: releasing its lease failed", run_id, exc_info=True)

    def _poisoned(self, taken: Claim) -> bool:
        """End the run as Ended(indeterminate) when it is past its poison budget (blocking)."""
        deaths = taken.claims - 1 - taken.failures  # earlier claims lost with their worker
        if taken.failures >= conf.poison_claims():
            reason = f"driving the run failed {taken.failures} times without a commit"
        elif deaths >= conf.poison_deaths():
            reason = f"the run stopped {deaths} workers without a commit"
        else:
            return False
        log.error("run %s: poison run; ending it: %s", taken.run_id, reason)
        metrics.poison_ended()
        end_run(
            taken.run_id, EndCause.INDETERMINATE, actor=f"worker:{self.worker_id}", reason=reason
        )
        return True

    def idle(self) -> bool:
        """True when no run this worker may come to drive is Running (Awaiting, paused and
        Ended runs need no worker; a run of an agent it does not carry, or under ``pinned`` of
        a version it does not carry, waits for another worker, ``runtime.versions``). A run
        of another version that a live worker holds back counts under ``drain``: that worker
        may die, and this one then takes the run over."""
        mine = versions.Claimable(versions.carried(), frozenset(), conf.agent_version_routing())
        return not Run.objects.filter(mine.q(), state="running", paused=False).exists()

    # -- the synchronous entry ---------------------------------------------------------------

    def step(self, tools: ThreadPool | None = None) -> bool:
        """Claim one runnable run and drive it on the calling thread (its statements inside
        the caller's transaction); return whether there was work (a claim or a fired timer).

        ``tools`` runs ``def`` tools (a pool of one thread made for this call when None).
        Due timers are looked for at most every TIMER_CHECK_SECONDS, or at once when idle with
        ``until_idle``.
        """
        keep_usable()
        taken = claim(self.worker_id)
        pool = tools or ThreadPool(1, "tools")
        try:
            return async_to_sync(self._step)(taken, Services.inline(pool))
        finally:
            if tools is None:
                pool.close()

    async def _step(self, taken: Claim | None, services: Services) -> bool:
        """``step`` on one event loop: the model clients it opens are bound to that loop, so
        they are closed on it too."""
        try:
            fired = await self._fire_timers(services, now=taken is None and self.until_idle)
            if taken is None:
                return fired > 0
            log.info("run %s: claimed (epoch %s)", taken.run_id, taken.lease.epoch)
            await self._drive(taken, services)
            return True
        finally:
            await services.providers.close()
