"""Run documents come from one snapshot: each equals the fold of its log at its version.

A real worker subprocess drives a run through many commits while approvals land from this
process; reader threads fetch the run document all the while and compare every one with a
fold of the log at the version it carries (tests/torn.py). Meaningful on PostgreSQL, where
reads run beside commits; on SQLite it checks the same property.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from django.db import connection

from runtime import operations
from runtime.documents import run_document
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.errors import RuntimeFault
from tests.torn import torn

pytestmark = pytest.mark.django_db(transaction=True)

STEP = {
    "tool_calls": [
        {"name": "ledger_replay", "arguments": {"key": "a"}},
        {"name": "ledger_approval", "arguments": {"key": "b"}},
        {"name": "ledger_replay", "arguments": {"key": "c"}},
    ]
}
READERS = 3


def approve_open_ticket(run_id: str) -> None:
    document = run_document(run_id)
    ticket = document["ticket"]
    if ticket is None:
        return
    command = ResumeCommand(
        ticket_id=ticket["id"], kind=TicketKind(ticket["kind"]), decision=Decision.APPROVE
    )
    with contextlib.suppress(RuntimeFault):  # consumed meanwhile: the next read shows it
        operations.resume(run_id, command, actor="test")


def test_documents_are_folds_at_their_version(start, spawn_worker) -> None:
    run_id = start(*([STEP] * 6), {"text": "done"})
    worker = spawn_worker(until_idle=False)
    done = threading.Event()
    torn_reads: list[str] = []
    reads = [0] * READERS

    def read(slot: int) -> None:
        try:
            while not done.is_set():
                document = run_document(run_id)
                reads[slot] += 1
                if (problem := torn(document)) is not None:
                    torn_reads.append(problem)
        finally:
            connection.close()

    readers = [threading.Thread(target=read, args=(i,)) for i in range(READERS)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 120
    try:
        while run_document(run_id)["state"] != "ended":
            assert time.monotonic() < deadline, "the run did not end"
            assert worker.process.poll() is None, worker.stderr
            approve_open_ticket(run_id)
    finally:
        done.set()
        for reader in readers:
            reader.join()
        worker.signal()
        worker.wait()
    assert run_document(run_id)["end_cause"] == "natural"
    assert min(reads) > 10, reads
    assert torn_reads == [], f"{len(torn_reads)} of {sum(reads)} reads torn: {torn_reads[:3]}"
