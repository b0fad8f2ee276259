"""Best-effort live fan-out over the Channels layer: unconfirmed Deltas and commit notices.

Nothing sent here is thread truth. A send that fails is logged and dropped; it never fails a
Run. Groups: ``live_run_<run id>`` (deltas and commits of one run), ``live_runs`` (every
commit, for the runs list). Message types: ``run.delta`` and ``run.commit``.

Deltas go only to runs someone watches (issue 29: a worker publishing every run's deltas fell
behind, and watched runs lost theirs). A viewer holds a ``Viewing`` while it is connected: in
this process a count per run, and with the Redis layer an entry of the sorted set
``WATCHED_KEY`` (run id, scored by its expiry) that it renews every ``WATCH_RENEW`` seconds,
so every process and worker sees it. A publisher reads the set's live members at most once
per ``WATCHED_FRESH`` seconds (one round trip per process, whatever the number of runs); a
delta of a run it knows unwatched costs nothing, and while its answer is stale the deltas wait
in the publisher's queue, in order, until it has read the set again. Commit notices are
always sent (one per step, and the runs list needs them). See docs/live.md.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
import weakref
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

from channels.layers import get_channel_layer
from django.conf import settings

from runtime.signals import CommitNotice

if TYPE_CHECKING:  # redis comes with the redis extra; it is imported only when the layer is Redis
    import redis.asyncio as aioredis

log = logging.getLogger("runtime.live")

ALL_RUNS_GROUP = "live_runs"
SENDS_AT_ONCE = 8  # groups sent to at once: within channels-redis's connections per host
WATCHED_KEY = "runtime:live:watched"  # sorted set: run id -> when its interest expires (unix s)
WATCH_TTL = 30.0  # a viewer's interest lapses this long after its last renewal (a dead process)
WATCH_RENEW = 10.0  # a connected viewer renews its interest this often
WATCHED_FRESH = 1.0  # a publisher reuses its read of the watched runs this long
CLOSE_WAIT = 2.0  # at exit, the private loop's pending sends get this long (seconds)


def run_group(run_id: str) -> str:
    return f"live_run_{run_id}"


class _Publisher:
    """Hands messages to one event loop that sends them in order, so a commit or a Delta
    never waits on the channel layer.

    The loop is the one that serves live viewers when this process has them (``bind``,
    called by the consumers: the in-memory layer only works within one loop), else a private
    loop on a daemon thread (a worker process publishing through Redis). With the in-memory
    layer and no viewer bound yet nothing is sent: no one could receive it (this spares every
    commit of a worker process without Redis the hand-over). A drain task runs only while
    messages wait, so a loop can close with nothing of ours pending.

    The private loop is closed at interpreter exit (``close``, registered with ``atexit`` when
    it starts): a management command that commits and returns at once (``runtime_start``)
    left the thread sending while the interpreter tore it down, and the process aborted
    ("FATAL: exception not rethrown", exit 134) after its commit, or exited before the commit
    notice was sent (issue 31, item 5).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        # The private loop and its thread while they run (``loop`` may be a bound one since).
        self.private: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None
        self.pending: deque[tuple[str, dict[str, Any]]] = deque()
        self.drainer: asyncio.Task[None] | None = None
        self.closes_at_exit = False

    def bind(self) -> None:
        """Send from the running loop from now on (call it on the loop viewers live on)."""
        loop = asyncio.get_running_loop()
        with self.lock:
            self.loop = loop

    def _start_private_loop(self) -> asyncio.AbstractEventLoop:  # under self.lock
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="live-publisher", daemon=True)
        thread.start()
        self.private = (loop, thread)
        if not self.closes_at_exit:
            atexit.register(self.close)
            self.closes_at_exit = True
        return loop

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Close the private loop, if one runs: give its pending sends up to ``wait`` seconds
        (what is still unsent then is dropped, and logged), close its Redis connections,
        stop it and join its thread. A loop bound to viewers (``bind``) is left alone: its
        server closes it. Never raises: the live stream is best-effort, and a process that
        committed must exit as it would without it (a failure here is logged). A later send
        starts a new private loop."""
        with self.lock:
            if self.private is None:
                return
            loop, thread = self.private
            self.private = None
            if self.loop is loop:
                self.loop = None
        try:
            finished = asyncio.run_coroutine_threadsafe(self._finish(wait), loop)
            finished.result(wait + CLOSE_WAIT)  # the sends' wait, then the connections' close
        except Exception:
            log.warning("closing the live publisher's connections failed", exc_info=True)
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:  # closed meanwhile
            return
        thread.join(CLOSE_WAIT)
        if thread.is_alive():
            log.warning("the live publisher's thread did not stop within %s s", CLOSE_WAIT)
            return
        try:
            # channels-redis closes the layer's connections of this loop when it closes.
            loop.close()
        except Exception:
            log.warning("closing the live publisher's loop failed", exc_info=True)

    async def _finish(self, wait: float) -> None:
        """On the loop: let the drain task send what waits for up to ``wait`` seconds, then
        cancel it, and close this loop's client of the watched set."""
        loop = asyncio.get_running_loop()
        drainer = self.drainer
        if drainer is not None and not drainer.done() and drainer.get_loop() is loop:
            await asyncio.wait({drainer}, timeout=wait)
            if not drainer.done():
                log.warning(
                    "live: the sends still running %s s after exit began were cancelled "
                    "(%d more messages waited); they are dropped",
                    wait,
                    len(self.pending),
                )
                drainer.cancel()
                self.pending.clear()
        client = _clients.pop(loop, None)
        if client is not None:
            await client.aclose()

    def _enqueue(self, item: tuple[str, dict[str, Any]]) -> None:  # runs on the loop
        self.pending.append(item)
        if self.drainer is None or self.drainer.done():
            self.drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Send what waits: each group's messages in order, the groups at once (a worker
        streams hundreds of runs: one round trip to Redis per message in turn fell seconds
        behind them)."""
        while self.pending:
            await _watched.refresh()  # deltas of runs nobody watches are dropped here
            by_group: dict[str, list[dict[str, Any]]] = {}
            held: deque[tuple[str, dict[str, Any]]] = deque()
            while self.pending:
                group, message = self.pending.popleft()
                if message.get("type") == "run.delta":
                    if _watched.awaits(message["run_id"]):  # no read since its answer began
                        held.append((group, message))
                        continue
                    if not _watched.has(message["run_id"]):
                        continue
                queued = by_group.setdefault(group, [])
                if queued and _continues(queued[-1], message):
                    queued[-1] = {**queued[-1], "text": queued[-1]["text"] + message["text"]}
                else:
                    queued.append(message)
            self.pending.extendleft(reversed(held))  # before what came meanwhile, in order
            groups = list(by_group.items())
            for at in range(0, len(groups), SENDS_AT_ONCE):
                batch = groups[at : at + SENDS_AT_ONCE]
                await asyncio.gather(*(self._send_all(g, m) for g, m in batch))

    async def _send_all(self, group: str, messages: list[dict[str, Any]]) -> None:
        layer = get_channel_layer()
        for message in messages:
            try:
                if layer is not None:
                    await layer.group_send(group, message)
            except Exception:  # the live stream is best-effort by design
                log.warning("live send to %s failed", group, exc_info=True)

    def send(self, group: str, message: dict[str, Any]) -> None:
        with self.lock:
            if self.loop is None and _in_process_layer():
                return  # an in-memory layer reaches only viewers of this process: none yet
            if self.loop is None or self.loop.is_closed():
                self.loop = self._start_private_loop()
            loop = self.loop
        try:
            loop.call_soon_threadsafe(self._enqueue, (group, message))
        except RuntimeError:  # the loop closed between the check and the call
            log.warning("live send to %s dropped: its loop is closed", group)


DELTA_KEY = ("type", "run_id", "step", "attempt", "claim", "kind", "index")


def _continues(earlier: dict[str, Any], later: dict[str, Any]) -> bool:
    """Whether ``later`` is a Delta that only adds text to ``earlier``'s (same run, step,
    attempt, claim, kind and call): while the sends fall behind, such Deltas go as one, so a
    worker streaming hundreds of runs sends fewer, longer messages, never other text."""
    return (
        later.get("type") == "run.delta"
        and not any(m.get(k) for m in (earlier, later) for k in ("name", "call_id"))
        and all(earlier.get(key) == later.get(key) for key in DELTA_KEY)
    )


def _redis_address() -> str | None:
    """The Redis URL of the channel layer (settings.CHANNEL_LAYERS), or None for any other."""
    layer = settings.CHANNEL_LAYERS.get("default", {})
    if not layer.get("BACKEND", "").startswith("channels_redis"):
        return None
    hosts = layer.get("CONFIG", {}).get("hosts") or [None]
    host = hosts[0]
    if isinstance(host, dict):
        host = host.get("address")
    return host if isinstance(host, str) else None


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = (
    weakref.WeakKeyDictionary()
)


def _client(address: str) -> aioredis.Redis:
    """This loop's client of the watched set (a redis.asyncio client serves one loop)."""
    import redis.asyncio  # the redis extra: only a Redis channel layer gets here

    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = redis.asyncio.Redis.from_url(address, socket_timeout=5)
    return client


class _Watched:
    """Which runs have a viewer, as this process knows it: its own viewers (counted at once)
    and, with Redis, the other processes' (the set read at most every WATCHED_FRESH s)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.local: Counter[str] = Counter()
        self.remote: frozenset[str] = frozenset()
        self.read_at = -float("inf")  # time.monotonic() of the last read of the set
        # Runs whose answer began after the last read started -> when it began (monotonic).
        self.awaiting: dict[str, float] = {}

    def has(self, run_id: str) -> bool:
        """Whether ``run_id`` has a viewer, by the last read (never waits)."""
        return self.local[run_id] > 0 or run_id in self.remote

    def known_unwatched(self, run_id: str) -> bool:
        """True when a fresh answer says nobody watches ``run_id``: its delta costs nothing."""
        if self.local[run_id] > 0:
            return False
        if _redis_address() is None:
            return True  # only this process's viewers can receive it
        if self.awaits(run_id):
            return False
        fresh = time.monotonic() - self.read_at < WATCHED_FRESH
        return fresh and run_id not in self.remote

    def begin_answer(self, run_id: str) -> None:
        """An answer of ``run_id`` starts streaming: its deltas wait for a read of the set
        that starts after now, so a viewer registered before the answer began receives all
        of it (one read per publisher's batch of new answers, not one per run)."""
        if self.local[run_id] > 0 or _redis_address() is None:
            return
        with self.lock:
            self.awaiting.setdefault(run_id, time.monotonic())

    def awaits(self, run_id: str) -> bool:
        """Whether ``run_id``'s answer began after the last read of the set started."""
        with self.lock:
            return run_id in self.awaiting

    async def refresh(self) -> None:
        """Read the watched set again when the last read is stale or an answer began since
        (on the running loop). A failed read is logged and keeps the last answer for another
        WATCHED_FRESH s."""
        address = _redis_address()
        with self.lock:
            forced = bool(self.awaiting)
        if address is None or (not forced and time.monotonic() - self.read_at < WATCHED_FRESH):
            return
        started = time.monotonic()
        try:
            members = await _client(address).zrangebyscore(WATCHED_KEY, time.time(), "+inf")
            self.remote = frozenset(m.decode() if isinstance(m, bytes) else str(m) for m in members)
        except Exception:  # the live stream is best-effort by design
            log.warning("reading the watched runs failed", exc_info=True)
        self.read_at = time.monotonic()
        with self.lock:
            for run_id in [r for r, began in self.awaiting.items() if began <= started]:
                del self.awaiting[run_id]

    def add(self, run_id: str, count: int) -> None:
        with self.lock:
            self.local[run_id] += count
            if self.local[run_id] <= 0:
                del self.local[run_id]


_watched = _Watched()


class Viewing:
    """One viewer's interest in one run's deltas, from ``start()`` until ``stop()`` (a
    console page's socket, an SSE stream with live deltas, a benchmark's sampler).

    ``start()`` returns once every process can see it (with Redis: the set entry is written;
    a failed write is logged, never raised). Publishers learn of it within WATCHED_FRESH s.
    """

    def __init__(self, run_id: str, redis_url: str | None = None) -> None:
        """``redis_url``: the Redis the publishers read (default: the channel layer's)."""
        self.run_id = run_id
        self.redis_url = redis_url
        self.renewer: asyncio.Task[None] | None = None
        self.started = False

    async def start(self) -> None:
        _watched.add(self.run_id, 1)
        self.started = True
        address = self.redis_url or _redis_address()
        if address is not None:
            await self._renew_once(address)
            self.renewer = asyncio.create_task(self._renew(address))

    async def _renew_once(self, address: str) -> None:
        now = time.time()
        try:
            async with _client(address).pipeline(transaction=False) as pipe:
                pipe.zadd(WATCHED_KEY, {self.run_id: now + WATCH_TTL})
                pipe.zremrangebyscore(WATCHED_KEY, "-inf", now)  # lapsed viewers' entries
                await pipe.execute()
        except Exception:  # the live stream is best-effort by design
            log.warning("registering a viewer of %s failed", self.run_id, exc_info=True)

    async def _renew(self, address: str) -> None:
        while True:
            await asyncio.sleep(WATCH_RENEW)
            await self._renew_once(address)

    async def stop(self) -> None:
        """Withdraw this viewer (this process at once; others when the entry lapses, as
        another process may still watch the same run). Safe to call twice."""
        if self.renewer is not None:
            self.renewer.cancel()
            self.renewer = None
        if self.started:
            self.started = False
            _watched.add(self.run_id, -1)


def _in_process_layer() -> bool:
    """True when the channel layer is the in-memory one (settings.CHANNEL_LAYERS), which
    carries messages only within this process."""
    backend = settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", "")
    return backend.endswith("InMemoryChannelLayer")


_publisher = _Publisher()
bind_to_running_loop = _publisher.bind
_send = _publisher.send


def publish_delta(
    run_id: str,
    *,
    step: int,
    attempt: int,
    delta: dict[str, Any],
    claim: int | None = None,
    first: bool = False,
) -> None:
    """Send one unconfirmed Delta: {"kind", "text", "index", "name", "call_id"}.

    ``step`` and ``attempt`` say which inference it belongs to; ``claim`` is the lease epoch
    of the worker streaming it, so a viewer starts afresh when another worker takes the
    same step over (its text never continues the dead worker's). Nothing is sent for a run
    nobody watches (``Viewing``). ``first``: the attempt's first Delta, after which the
    publisher reads who watches before it sends or drops any of the answer (a viewer that
    registered before the answer began receives all of it).
    """
    if first:
        _watched.begin_answer(run_id)
    if _watched.known_unwatched(run_id):
        return
    _send(
        run_group(run_id),
        {
            "type": "run.delta",
            "run_id": run_id,
            "step": step,
            "attempt": attempt,
            "claim": claim,
            **delta,
        },
    )


def publish_commit(notice: CommitNotice) -> None:
    """Tell live viewers a commit landed, so they refresh committed state from the server."""
    message = {
        "type": "run.commit",
        "run_id": notice.run_id,
        "thread_id": notice.thread_id,
        "seq": notice.seq,
        "state": notice.state,
    }
    if notice.run_id:
        _send(run_group(notice.run_id), message)
    _send(ALL_RUNS_GROUP, message)
