"""Which worker may drive which run during a deploy, as values and decisions (no I/O).

A run records the deployed version of its agent it started with (``Run.agent_version``); a
worker carries one version of each agent it has (issue 34, item 2). A worker claims:

- a run of an agent it does not carry: never (the run waits for a worker that carries it);
- a run of its own version (or one that predates versions, ``""``): always;
- a run of another version: only while no live worker carries that version, and only under
  ``Routing.DRAIN``. So in a mixed fleet during a rolling deploy the old version's runs go to
  the old workers; once the last of them is gone the new workers take them over, and a call
  that the new code cannot run is completed with an error the model sees (issue 34, item 4),
  never a poison loop. Under ``Routing.PINNED`` such a run waits for a worker of its own
  version, and says so.

The database layer (``runtime.versions``) reads the fleet and applies these rules as a
statement's condition; the console and the API show ``no_worker_reason``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum


class Routing(StrEnum):
    """What happens to a run whose version no live worker carries
    (RUNTIME_AGENT_VERSION_ROUTING)."""

    DRAIN = "drain"  # a worker of another version of its agent takes it over
    PINNED = "pinned"  # it waits for a worker of its own version


Pair = tuple[str, str]  # (agent name, deployed version)


def claimable(
    agent: str, version: str, mine: Mapping[str, str], live: Collection[Pair], routing: Routing
) -> bool:
    """Whether a worker carrying ``mine`` (agent name → its deployed version) may drive a run
    of ``agent`` started with ``version``, while the live workers carry the ``live`` pairs."""
    if agent not in mine:
        return False
    if version in ("", mine[agent]):
        return True
    return routing is Routing.DRAIN and (agent, version) not in live


def no_worker_reason(agent: str, version: str, fleet: Collection[Pair], routing: Routing) -> str:
    """Why no live worker may drive a run of ``agent`` started with ``version`` when the live
    workers carry the ``fleet`` pairs ("" when one may, or when no worker is live at all:
    then nothing is driven, which the run's holder says)."""
    carried = sorted(v for a, v in fleet if a == agent)
    if not fleet:
        return ""
    if not carried:
        return f"waiting for a worker that carries agent {agent}"
    if version in ("", *carried) or routing is Routing.DRAIN:
        return ""
    return (
        f"waiting for a worker with version {version} of agent {agent} (live workers carry"
        f" {', '.join(carried)}; RUNTIME_AGENT_VERSION_ROUTING is pinned)"
    )
