"""JSON documents the API builds from committed rows (the run document itself is
``runtime.documents.run_document``, shared with the CLI)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime import versions
from runtime.documents import RUN_SUMMARY_FIELDS, held_back, input_lines, run_document
from runtime.models import Run, ThreadCommit


def with_active_batch(document: dict[str, Any]) -> dict[str, Any]:
    """Add ``active_batch``: the run's open batch, or None once it is finalized."""
    last = document["batches"][-1] if document["batches"] else None
    return {**document, "active_batch": last if last and not last["finalized"] else None}


def run_out(run_id: str) -> dict[str, Any]:
    """The run document of ``run_id`` with its active batch; raises NotFound."""
    return with_active_batch(run_document(run_id))


def run_summaries(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The summaries of a page of runs, read with RUN_SUMMARY_FIELDS: one more query for
    their input lines (``runtime.documents.input_lines``)."""
    inputs = input_lines([run.id for run in runs])
    unserved = versions.reasons(runs)
    return [run_summary(run, inputs.get(run.id, ""), unserved.get(run.id)) for run in runs]


def run_summary(run: Run, input_line: str, unserved: str | None = None) -> dict[str, Any]:
    """``unserved``: why no live worker may drive it (``runtime.versions.reasons``)."""
    return {
        "id": run.id,
        "thread_id": run.thread_id,
        "agent": run.agent,
        "agent_version": run.agent_version,
        "state": run.state,
        "end_cause": run.end_cause,
        "version": run.version,
        "step": run.step,
        "created_by": run.created_by,
        "created_at": run.created_at.isoformat(),
        "committed_at": run.committed_at.isoformat() if run.committed_at else None,
        "paused": run.paused,
        "input": input_line,
        "waiting": held_back(run) or unserved,
    }


SUMMARY_FIELDS = RUN_SUMMARY_FIELDS


def commit_document(commit: ThreadCommit) -> dict[str, Any]:
    """One log entry: its sequence, disposition, messages and events, as committed."""
    return {
        "seq": commit.seq,
        "thread_id": commit.thread_id,
        "run_id": commit.run_id,
        "disposition": commit.disposition,
        "messages": commit.messages,
        "events": commit.events,
        "actor": commit.actor,
        "agent_version": commit.agent_version,
        "created_at": commit.created_at.isoformat(),
    }


def ends_run(commit: dict[str, Any]) -> bool:
    """Whether a commit document carries the run's Ended disposition."""
    disposition = commit.get("disposition") or {}
    return disposition.get("state") == "ended"
