"""Tools: a declared name, argument schema, recovery policy and default permission.

Arguments are validated with pydantic before execution (from the function's type hints);
invalid arguments become an error result for the model, never a crash. The policy, permission
and attempt budget in force when a batch is committed are pinned into each call.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from runtime import conf, metrics, tracing
from runtime.domain.model import Effects, Permission, RecoveryPolicy
from runtime.untrusted import UntrustedJSONError, parse_object


class Fenced(Exception):
    """This worker no longer owns the run: another took it over; the effect must not apply."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool knows of its call.

    Pass ``operation_id`` downstream to deduplicate, and ``(worker_id, lease_epoch)`` as a
    fencing token where the downstream system can check one. ``still_owner()`` is a cheap
    look (one indexed read) right before an effect; ``fence()`` holds the run's lease for the
    rest of the caller's database transaction, so an effect written in that transaction
    cannot land beside a takeover's (issue: "commits are fenced; effects are not").

    An ``async def`` tool runs on the worker's event loop, where no blocking call belongs: it
    awaits ``astill_owner()`` and ``afenced(effect)`` instead, which run on the worker's
    database threads. ``wait_for``/``wait_until`` raise and so work the same in both.
    """

    run_id: str
    call_id: str
    operation_id: str
    attempt: int
    worker_id: str
    lease_epoch: int = 0
    woken_at: str | None = None  # the due time of the timer that woke this attempt
    # Runs a blocking function where the worker's statements run (runtime.loop.Services.db).
    db: Callable[..., Awaitable[Any]] | None = field(default=None, repr=False, compare=False)

    def _lease(self) -> Any:
        from runtime.models import Run

        return Run.objects.filter(
            id=self.run_id,
            state="running",
            lease_owner=self.worker_id,
            lease_epoch=self.lease_epoch,
        )

    def still_owner(self) -> bool:
        """True while this worker's claim (its lease epoch) still owns the Running run."""
        return self._lease().exists()

    def fence_sql(self) -> tuple[str, list[Any]]:
        """A ``SELECT`` of this claim's run row (locked on PostgreSQL) and its parameters, for a
        tool whose downstream is this database: an effect written as ``WITH fence AS (...)
        INSERT ... SELECT ... FROM fence`` lands in one statement only while the claim owns
        the run, and no takeover can happen while it runs."""
        from runtime.db import connection
        from runtime.models import Run

        lock = " FOR UPDATE" if connection.vendor == "postgresql" else ""
        table = connection.ops.quote_name(Run._meta.db_table)
        sql = (
            f"SELECT id FROM {table} WHERE id = %s AND state = 'running' "
            f"AND lease_owner = %s AND lease_epoch = %s{lock}"
        )
        return sql, [self.run_id, self.worker_id, self.lease_epoch]

    def fence(self) -> None:
        """Inside ``runtime.db.atomic()``: lock the run's row while this claim owns it, so
        no other worker can take it over before the transaction ends (a claim skips locked
        rows). Raises Fenced when this claim no longer owns the run."""
        if not self._lease().select_for_update().values_list("id", flat=True).first():
            raise Fenced(f"run {self.run_id} is no longer owned by lease {self.lease_epoch}")

    def keep_lease(self) -> bool:
        """Renew this claim's lease from now (the database's clock at the moment of the
        statement, even inside a long transaction); True while the claim owns the run.

        Called after a fenced effect that held the run's row locked: the worker's heartbeat
        skips a locked row rather than wait for it, so the lease is extended here before a
        peer could find it lapsed (docs/leases.md)."""
        from runtime.db import connection
        from runtime.models import Run

        ttl = conf.lease_ttl()
        if connection.vendor == "postgresql":
            table = connection.ops.quote_name(Run._meta.db_table)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {table} SET lease_expires_at = clock_timestamp() + %s "
                    "WHERE id = %s AND state = 'running' AND lease_owner = %s "
                    "AND lease_epoch = %s",
                    [ttl, self.run_id, self.worker_id, self.lease_epoch],
                )
                return cursor.rowcount > 0
        from django.utils import timezone

        return bool(self._lease().update(lease_expires_at=timezone.now() + ttl))

    async def astill_owner(self) -> bool:
        """``still_owner()`` for an ``async def`` tool."""
        return bool(await self._db(self.still_owner))

    async def afenced[T](self, effect: Callable[[], T]) -> T:
        """For an ``async def`` tool: run the blocking ``effect()`` in one database transaction
        that first takes ``fence()``; return what it returns. Raises Fenced (nothing of the
        effect is written) when this claim no longer owns the run."""

        def fenced() -> T:
            from runtime import db

            with db.atomic():
                self.fence()
                done = effect()
                # Inside the transaction: the lease is live when the row lock is let go.
                self.keep_lease()
                return done

        return await self._db(fenced)

    def _db(self, fn: Callable[[], Any]) -> Awaitable[Any]:
        if self.db is None:
            from asgiref.sync import sync_to_async

            return sync_to_async(fn)()
        return self.db(fn)

    def wait_until(self, when: datetime) -> None:
        """Wait until ``when`` (an aware datetime) without holding a worker.

        Returns at once when that time has come, or when a timer due at or after it woke this
        attempt; otherwise raises WaitRequested, which commits the call Awaiting with a timer
        ticket (seed: Executing -> Awaiting, scheduled wait). After the timer fires the tool
        runs again as the next attempt, so the code before the wait must be safe to repeat.
        Raises ValueError for a naive datetime.
        """
        if when.tzinfo is None:
            raise ValueError("wait_until needs an aware datetime (UTC recommended)")
        woken = datetime.fromisoformat(self.woken_at) if self.woken_at else None
        if (woken is not None and woken >= when) or datetime.now(UTC) >= when:
            return
        raise WaitRequested(when.astimezone(UTC))

    def wait_for(self, seconds: float) -> None:
        """Wait ``seconds`` (from the first attempt that asks) without holding a worker."""
        if self.woken_at is None and seconds > 0:
            raise WaitRequested(datetime.now(UTC) + timedelta(seconds=seconds))


class WaitRequested(Exception):  # noqa: N818 - a request, not an error
    """Raised by ``ToolContext.wait_until``: the call waits on a timer due at ``due_at``."""

    def __init__(self, due_at: datetime) -> None:
        super().__init__(due_at.isoformat())
        self.due_at = due_at


class ToolError(Exception):
    """The tool failed without effect; the message becomes an error result for the model."""


class ToolArgumentsError(ToolError):
    """The model's arguments do not match the tool's schema."""


@dataclass(frozen=True, slots=True)
class InputWait:
    """Declares that a tool asks a person for input: its ticket's request and JSON schema."""

    build: Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]]


@dataclass(frozen=True)
class Delegate:
    """Declares that a tool delegates to a child Run of ``agent`` (terminal-only).

    ``metadata(arguments)`` builds the child's run metadata from the call's validated
    arguments (the demo passes the child's script this way); the child's input is
    ``arguments["input"]``.
    """

    agent: str
    metadata: Callable[[dict[str, Any]], dict[str, Any]] | None = None


class DelegateArguments(BaseModel):
    """The arguments of a delegate tool: the task for the child agent."""

    model_config = ConfigDict(extra="forbid")
    input: Annotated[str, Field(min_length=1, max_length=20000, description="the child's task")]


@dataclass(frozen=True)
class Tool:
    """A tool an agent may call.

    ``fn(ctx, **arguments)`` returns any JSON-encodable value (a str is published as is).
    ``lookup(ctx)`` (reconnect tools) returns the earlier result for ``ctx.operation_id``, or
    None when the downstream system never saw it. ``input_wait`` makes the call open an input
    ticket instead of running ``fn``. ``source`` says where the tool comes from (pinned into
    each call): ``{"kind": "python"}`` here, ``{"kind": "mcp", ...}`` for ``runtime.mcp`` tools.
    """

    name: str
    description: str
    fn: Callable[..., Any]
    arguments_model: Any
    policy: RecoveryPolicy = RecoveryPolicy.INDETERMINATE
    permission: Permission = Permission.ALLOW
    max_attempts: int = 1
    lookup: Callable[[ToolContext], Any] | None = None
    input_wait: InputWait | None = None
    source: Mapping[str, Any] = field(default_factory=lambda: {"kind": "python"})
    delegate: Delegate | None = None
    effects: Effects = Effects.ONCE

    @cached_property
    def parameters(self) -> dict[str, Any]:
        """The arguments' JSON schema, as providers send it to the model (built once)."""
        schema = self.arguments_model.model_json_schema()
        schema.pop("title", None)
        return schema

    def parse(self, arguments_text: str) -> dict[str, Any]:
        """Parse and validate the model's raw argument text; raise ToolArgumentsError."""
        try:
            raw = parse_object(arguments_text)
        except UntrustedJSONError as exc:
            raise ToolArgumentsError(str(exc)) from exc
        try:
            return self.arguments_model.model_validate(raw).model_dump(mode="json")
        except ValidationError as exc:
            errors = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {errors}") from exc

    @property
    def is_async(self) -> bool:
        """Whether the tool is an ``async def`` (run with ``arun`` on the event loop)."""
        return inspect.iscoroutinefunction(self.fn)

    def run(self, ctx: ToolContext, arguments: dict[str, Any]) -> str:
        """Execute a ``def`` tool (blocking); return the result text published to the model.

        Each attempt is counted and timed (``runtime_tool_*`` metrics) by outcome: ok, error
        (a ToolError, re-raised) or failure (any other exception, re-raised), and traced as an
        ``execute_tool NAME`` span (runtime.tracing).
        """
        with self._observed(ctx):
            value = self.fn(ctx, **arguments)
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    async def arun(self, ctx: ToolContext, arguments: dict[str, Any]) -> str:
        """Execute an ``async def`` tool; as ``run`` otherwise."""
        with self._observed(ctx):
            value = await self.fn(ctx, **arguments)
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    @contextmanager
    def _observed(self, ctx: ToolContext) -> Iterator[None]:
        started = time.perf_counter()
        outcome = "failure"
        policy = self.policy.value
        with tracing.tool_span(self.name, ctx.operation_id, ctx.attempt, policy) as span:
            try:
                yield
                outcome = "ok"
            except ToolError:
                outcome = "error"
                raise
            finally:
                metrics.tool_observed(self.name, policy, outcome, time.perf_counter() - started)
                if outcome != "ok":
                    tracing.failed(span, outcome)


def default_effects(policy: RecoveryPolicy) -> Effects:
    """The Effects of a tool that declares none: never "none" (that must be said), so
    ``idempotent`` for a replay-safe policy and ``once`` otherwise."""
    return Effects.IDEMPOTENT if policy is RecoveryPolicy.REPLAY else Effects.ONCE


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    policy: RecoveryPolicy | None = None,
    permission: Permission = Permission.ALLOW,
    max_attempts: int = 1,
    lookup: Callable[[ToolContext], Any] | None = None,
    input_wait: InputWait | None = None,
    name: str | None = None,
    effects: Effects | str | None = None,
) -> Callable[[Callable[..., Any]], Tool]:
    """Declare a tool from a function ``fn(ctx: ToolContext, **typed_arguments)``, a ``def``
    (run on the worker's tool threads) or an ``async def`` (run on its event loop).

    The arguments' schema comes from the type hints after ``ctx``; the description from the
    docstring. Extra arguments from the model are refused. ``effects`` ("none",
    "idempotent" or "once") says whether the tool changes anything outside the runtime;
    left out, it is ``default_effects(policy)``. Raises ValueError for another value, and
    TypeError at definition time, saying what to write, for ``@tool`` without a recovery
    policy and for a function whose first parameter is not the context ``ctx``.
    """
    if fn is not None or policy is None:
        raise TypeError(
            "@tool needs a recovery policy: write @tool(policy=RecoveryPolicy.REPLAY) for a "
            "tool safe to run again, RecoveryPolicy.RECONNECT with lookup=... for one whose "
            "downstream can be asked, or RecoveryPolicy.INDETERMINATE for one to reconcile"
        )
    pinned = policy
    declared = Effects(effects) if effects is not None else default_effects(policy)

    def decorate(fn: Callable[..., Any]) -> Tool:
        params = list(inspect.signature(fn, eval_str=True).parameters.values())
        if not params or params[0].name != "ctx":
            raise TypeError(
                f"tool {fn.__name__!r}: its first parameter must be the context, written "
                f"`def {fn.__name__}(ctx: ToolContext, ...)`; the model's arguments follow it"
            )
        # Any: mypy checks a spread dict's values against every keyword (__config__, __base__)
        fields: dict[str, Any] = {
            p.name: (p.annotation, ... if p.default is inspect.Parameter.empty else p.default)
            for p in params[1:]
        }
        model = create_model(
            f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        return Tool(
            name=name or fn.__name__,
            description=inspect.cleandoc(fn.__doc__ or ""),
            fn=fn,
            arguments_model=model,
            policy=pinned,
            permission=permission,
            max_attempts=max_attempts,
            lookup=lookup,
            input_wait=input_wait,
            effects=declared,
        )

    return decorate


def _never_run(ctx: ToolContext, **arguments: Any) -> Any:
    raise AssertionError("a delegate tool starts a child run; it is never run as a function")


def delegate(
    *,
    agent: str,
    name: str,
    description: str,
    arguments_model: type[BaseModel] = DelegateArguments,
    metadata: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Tool:
    """Declare a tool that delegates to a child Run of ``agent``.

    The model calls it like any tool, with an ``input`` argument (``arguments_model`` may add
    more). Starting the child is idempotent by the call's operation id, so the tool replays,
    and its effects are ``idempotent``: the child's own calls carry their own effects.
    """
    return Tool(
        name=name,
        description=description,
        fn=_never_run,
        arguments_model=arguments_model,
        policy=RecoveryPolicy.REPLAY,
        max_attempts=3,
        delegate=Delegate(agent=agent, metadata=metadata),
        effects=Effects.IDEMPOTENT,
    )
