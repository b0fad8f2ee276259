"""Test agents with limits (issue 23), loaded by worker subprocesses through RUNTIME_AGENTS:
``limited`` (the demo's tools and the scripted model, at most 5 runs at once and one per
customer) and ``modeled`` (the demo's tools asking the model server at
RUNTIME_TEST_MODEL_URL, model "m", whose limit the test sets in RUNTIME_MODEL_LIMITS)."""

from __future__ import annotations

import os
from dataclasses import replace

from runtime.agents import Agent, ProviderConfig
from runtime.demo.agent import demo
from runtime.domain.limits import RunLimit

AGENTS = ",".join(
    (
        "runtime.demo.agent.demo",
        "tests.runtime.limited_agent.limited",
        "tests.runtime.limited_agent.modeled",
    )
)
RUNS, PER_CUSTOMER = 5, 1

limited = replace(
    demo, name="limited", limits=RunLimit(runs=RUNS, key="customer", per_key=PER_CUSTOMER)
)


def modeled() -> Agent:
    url = os.environ.get("RUNTIME_TEST_MODEL_URL", "http://127.0.0.1:9/v1")
    return replace(
        demo,
        name="modeled",
        provider=ProviderConfig(kind="openai", model="m", base_url=url, timeout=60),
    )
