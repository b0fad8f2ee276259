"""Simultaneous keyless cancels through two server processes all get the terminus (item 5).

A cancel whose commit finds the run already Ended (another cancel won between its read and
its commit) answers the terminus, as any command to an Ended run does: never 409.
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import ExitStack

import httpx
import pytest

from tests.api.conftest import BASE, drive
from tests.servers import serving

pytestmark = pytest.mark.django_db(transaction=True)

CANCELS = 20
ROUNDS = 3


def test_simultaneous_cancels_answer_the_terminus(make_user, start, subprocess_env, tmp_path):
    _, token = make_user("carol", "read", "operate")
    headers = {"Authorization": f"Bearer {token}"}
    with ExitStack() as stack:
        urls = [
            stack.enter_context(serving(subprocess_env, tmp_path / f"server{i}.log"))
            for i in range(2)
        ]
        for _ in range(ROUNDS):
            run = start({"tool_calls": [{"name": "ledger_approval", "arguments": {"key": "b"}}]})
            drive()
            answers: list[tuple[int, dict]] = []
            barrier = threading.Barrier(CANCELS)

            def cancel(url: str, run_id: str = run["id"], gate=barrier, out=answers) -> None:
                with httpx.Client(base_url=url + BASE, headers=headers, timeout=60) as client:
                    gate.wait()
                    response = client.post(f"/runs/{run_id}/cancel", json={"reason": "x"})
                out.append((response.status_code, response.json()))

            threads = [threading.Thread(target=cancel, args=(urls[i % 2],)) for i in range(CANCELS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            statuses = Counter(status for status, _ in answers)
            assert statuses == {200: CANCELS}, [a for a in answers if a[0] != 200][:2]
            termini = {(b["state"], b["end_cause"], b["version"]) for _, b in answers}
            assert len(termini) == 1 and next(iter(termini))[:2] == ("ended", "cancelled")
