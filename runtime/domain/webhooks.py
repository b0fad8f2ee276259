"""What a commit tells the outside world, and when a failed delivery is tried again.

Pure: no Django, no clock, no I/O. ``notifications`` maps one validated commit (the run before
and after, and the draft) to the webhook events it owes, as values; the coordinator writes one
outbox row per (subscribed endpoint, event) in the commit's own write, so an event exists if
and only if its commit does (issue 23, item 3). ``next_attempt`` is the retry decision the
delivery task applies (like procrastinate's retry strategies). ``host_problem``,
``internal`` and ``AllowList`` say where a request may go (no internal addresses by default).

Adding an event kind is one ``case`` in ``_from_event`` (or one test in ``notifications``) and
one member of ``WebhookEvent``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from socket import inet_aton

from runtime.domain.commit import CommitDraft
from runtime.domain.events import CallIndeterminate, Event, RunPaused
from runtime.domain.model import JSON, ResumeTicket, RunState, RunView, TicketKind


class WebhookEvent(StrEnum):
    """The kinds of event an endpoint subscribes to (its ``events`` list)."""

    TICKET_OPENED = "ticket.opened"  # a person must answer: an approval or an input
    RUN_ENDED = "run.ended"  # with its EndCause
    CALL_INDETERMINATE = "call.indeterminate"  # a call's outcome is unknown
    RUN_PAUSED = "run.paused"  # an operator paused the run (issue 23, item 1)
    TEST = "webhook.test"  # the "send test" button; never from a commit


# The events an endpoint may subscribe to (a test is sent to one endpoint on request).
SUBSCRIBABLE: tuple[WebhookEvent, ...] = tuple(
    e for e in WebhookEvent if e is not WebhookEvent.TEST
)

# Tickets a person answers; a delegation ticket is answered by its child, a timer by time.
PERSON_TICKETS = (TicketKind.APPROVAL, TicketKind.INPUT)


@dataclass(frozen=True, slots=True, kw_only=True)
class Notification:
    """One webhook event a commit owes: its kind and the committed facts it reports."""

    kind: WebhookEvent
    facts: dict[str, JSON]


def notifications(
    draft: CommitDraft, before: RunView | None, run: RunView | None
) -> tuple[Notification, ...]:
    """The webhook events one commit owes, in a fixed order (events first, in commit order,
    then tickets opened, then the run's end). ``before`` and ``run`` are the commit's run
    before and after (None for a thread note). Pure: the same commit gives the same list."""
    found = [n for event in draft.events for n in _from_event(event, run)]
    if run is not None:
        found += [_ticket_opened(t) for t in _opened(before, run) if t.kind in PERSON_TICKETS]
        if run.state is RunState.ENDED and (before is None or before.state is not RunState.ENDED):
            found.append(_run_ended(run))
    return tuple(found)


def _from_event(event: Event, run: RunView | None) -> Iterator[Notification]:
    """The webhook events one committed event owes (the place to wire a new fact kind)."""
    match event:
        case CallIndeterminate(call_id=call_id, reason=reason):
            call = run.find_call(call_id) if run else None
            yield Notification(
                kind=WebhookEvent.CALL_INDETERMINATE,
                facts={
                    "call": {
                        "id": call_id,
                        "name": call.name if call else None,
                        "operation_id": call.operation_id if call else None,
                        "effect_may_have_started": bool(call and call.effect_may_have_started),
                        "reason": reason,
                    }
                },
            )
        case RunPaused(ticket=ticket):
            yield Notification(
                kind=WebhookEvent.RUN_PAUSED,
                facts={"pause": {"ticket_id": ticket.id, **ticket.request}},
            )
        case _:
            return


def _opened(before: RunView | None, run: RunView) -> list[ResumeTicket]:
    def open_of(view: RunView | None) -> dict[str, ResumeTicket]:
        if view is None:
            return {}
        return {t.id: t for t in ((view.ticket,) if view.ticket else ()) + view.waits}

    old, new = open_of(before), open_of(run)
    return [new[i] for i in sorted(new.keys() - old.keys())]


def _ticket_opened(ticket: ResumeTicket) -> Notification:
    return Notification(
        kind=WebhookEvent.TICKET_OPENED,
        facts={
            "ticket": {
                "id": ticket.id,
                "kind": ticket.kind.value,
                "call_id": ticket.call_id,
                "request": ticket.request,
            }
        },
    )


def _run_ended(run: RunView) -> Notification:
    return Notification(
        kind=WebhookEvent.RUN_ENDED,
        facts={"end_cause": run.end_cause.value if run.end_cause else None, "error": run.error},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    """Try again after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True, slots=True, kw_only=True)
class GiveUp:
    """Stop: the delivery is failed after ``attempts`` attempts."""

    attempts: int


def next_attempt(
    attempts: int, *, max_attempts: int, base: float, cap: float, jitter: float
) -> Retry | GiveUp:
    """Decide what follows failed attempt number ``attempts`` (1 for the first).

    Exponential backoff with "full jitter" kept above half (AWS's architecture blog's
    "equal jitter"): ``min(cap, base * 2**(attempts-1))`` times a factor in [0.5, 1],
    ``jitter`` being a uniform draw in [0, 1] supplied by the caller (pure: no randomness
    here). After ``max_attempts`` attempts the delivery is given up.
    """
    if attempts >= max_attempts:
        return GiveUp(attempts=attempts)
    ceiling = min(cap, base * 2 ** (attempts - 1))
    return Retry(delay=ceiling * (0.5 + 0.5 * min(max(jitter, 0.0), 1.0)))


def message_id(thread_id: str, seq: int, idx: int) -> str:
    """The ``webhook-id`` of the ``idx``-th event of commit ``seq`` of a thread: the same for
    every endpoint and attempt, so a receiver deduplicates redeliveries by it."""
    return f"msg_{thread_id}_{seq}_{idx}"


def body(
    notification: Notification,
    *,
    message: str,
    run: RunView | None,
    thread_id: str,
    seq: int,
    actor: str,
    at: str,
    url: str | None,
) -> dict[str, JSON]:
    """The JSON body of one event, in Standard Webhooks' shape ``{"type", "timestamp",
    "data"}``. ``data`` holds the run's ids, agent and the agent's version it started with
    (``agent_version``, "" before versions were recorded) and console link (``url``), the
    commit (``seq``, ``actor``, ``committed_at`` = ``at``, ISO 8601 UTC) and the event's
    committed facts."""
    data: dict[str, JSON] = {
        "id": message,
        "run_id": run.run_id if run else None,
        "thread_id": thread_id,
        "agent": run.agent if run else None,
        "agent_version": run.agent_version if run else None,
        "url": url,
        "seq": seq,
        "actor": actor,
        "committed_at": at,
        "state": run.state.value if run else None,
        **notification.facts,
    }
    return {"type": notification.kind.value, "timestamp": at, "data": data}


# -- where requests may go (issue 23 item 3, the tester's SSRF finding) --------------------------

Address = IPv4Address | IPv6Address

# IPv6 prefixes whose last 32 bits are an IPv4 address a packet to them reaches: IPv4-compatible
# (``::a.b.c.d``, RFC 4291, deprecated), IPv4-mapped, SIIT's IPv4-translated (``::ffff:0:
# a.b.c.d``, RFC 7915), NAT64's well-known prefix (RFC 6052) and its local-use /48 (RFC 8215,
# the IPv4 address last, as with a /96 inside it). ``ipaddress`` reads 6to4 and Teredo.
EMBEDS_IPV4 = tuple(
    IPv6Network(n)
    for n in ("::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48")
)

# Blocks the IANA IPv6 special-purpose registry does not mark globally reachable that Python
# before 3.12.4 still calls global (``is_global``): 6to4 and NAT64's local-use prefix.
NOT_GLOBAL = (IPv6Network("2002::/16"), IPv6Network("64:ff9b:1::/48"))


@dataclass(frozen=True, slots=True)
class AllowList:
    """Hosts requests may go to even when they are internal (RUNTIME_WEBHOOK_ALLOW_HOSTS):
    host names (exact, lower case) and networks."""

    names: frozenset[str] = frozenset()
    networks: tuple[IPv4Network | IPv6Network, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """From host names and IP addresses or CIDRs (``127.0.0.1``, ``10.0.0.0/8``); raises
        ValueError for an entry that is not a string, or a malformed CIDR (one with a ``/``)."""
        names: set[str] = set()
        networks = []
        for entry in entries:
            if not isinstance(entry, str) or not entry.strip():
                raise ValueError(f"each entry is a host name or a CIDR, got {entry!r}")
            text = entry.strip().lower()
            try:
                networks.append(ip_network(text.strip("[]"), strict=False))
            except ValueError:
                if "/" in text:
                    raise ValueError(f"{entry!r} is not a CIDR") from None
                names.add(text)
        return cls(frozenset(names), tuple(networks))

    def names_host(self, host: str) -> bool:
        """Whether ``host`` is allowed by name."""
        return host.lower() in self.names

    def permits(self, address: Address) -> bool:
        """Whether a request may connect to ``address``: a public one, or one allowed."""
        return not internal(address) or any(address in n for n in self.networks)


def internal(address: Address) -> bool:
    """Whether ``address`` is one a webhook must not reach by default: loopback, private,
    link-local (the cloud metadata service, 169.254.169.254), shared (CGNAT, 100.64/10),
    multicast, unspecified or reserved: whatever the IANA special-purpose registries do not
    mark globally reachable (``ipaddress``'s ``is_global``, and ``NOT_GLOBAL``), and
    multicast. An IPv6 address that carries an IPv4 one (``embedded_ipv4``) is internal when
    that IPv4 address is. The one judge of an address: the URL check and every address a name
    resolves to when sending go through it."""
    if isinstance(address, IPv6Address):
        if any(internal(v4) for v4 in embedded_ipv4(address)):
            return True
        if any(address in network for network in NOT_GLOBAL):
            return True
    return address.is_multicast or not address.is_global


def embedded_ipv4(address: IPv6Address) -> tuple[IPv4Address, ...]:
    """The IPv4 addresses ``address`` carries, which a packet to it may reach: mapped
    (``::ffff:a.b.c.d``), compatible (``::a.b.c.d``), SIIT (``::ffff:0:a.b.c.d``), NAT64
    (``64:ff9b::a.b.c.d``, ``64:ff9b:1::a.b.c.d``), 6to4 (``2002:AABB:CCDD::``) and Teredo
    (its server and its client); none for another address."""
    found: list[IPv4Address] = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    if any(address in network for network in EMBEDS_IPV4):
        found.append(IPv4Address(int(address) & 0xFFFFFFFF))
    return tuple(found)


def literal_address(host: str) -> Address | None:
    """The IP address ``host`` names literally, or None for a host name. The old numeric
    forms a resolver still accepts (``0x7f000001``, ``127.1``, ``2130706433``, ``0177.0.0.1``,
    with or without a trailing dot) count: they reach the address they encode."""
    try:
        return ip_address(host.strip("[]"))
    except ValueError:
        pass
    numeric = host.removesuffix(".")  # the root's dot: ``127.0.0.1.`` is 127.0.0.1
    if not _NUMERIC_V4.fullmatch(numeric):
        return None
    try:
        return IPv4Address(inet_aton(numeric))  # parses text; no lookup
    except OSError:
        return None


_NUMERIC_V4 = re.compile(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}", re.IGNORECASE)

LOCAL_NAMES = ("localhost", "localhost.localdomain")


def host_problem(host: str, allow: AllowList) -> str | None:
    """Why a webhook may not be sent to ``host`` judged by its name alone (an internal IP
    literal, or ``localhost``), or None; the addresses a name resolves to are judged when
    sending."""
    if allow.names_host(host):
        return None
    address = literal_address(host)
    if address is not None and not allow.permits(address):
        return f"{host} is an internal address (allow it in RUNTIME_WEBHOOK_ALLOW_HOSTS)"
    name = host.lower().rstrip(".")
    if name in LOCAL_NAMES or name.endswith(".localhost"):
        return f"{host} is this machine (allow it in RUNTIME_WEBHOOK_ALLOW_HOSTS)"
    return None
