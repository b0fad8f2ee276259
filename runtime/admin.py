"""The runtime's tables in Django's admin, read only.

The log and its projections change only through the commit coordinator (one write path), and
the operational rows only through the worker; the admin is for looking, never for editing.
Staff need the model's ``view`` permission to see each table.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from runtime import models


class ReadOnlyAdmin(admin.ModelAdmin):
    """Lists and detail pages, no add, change or delete (also for superusers)."""

    list_per_page = 50
    show_full_result_count = False  # a COUNT(*) over the log on every page is not needed

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(models.Thread)
class ThreadAdmin(ReadOnlyAdmin):
    list_display = ("id", "version", "active_run", "created_at")
    search_fields = ("id",)
    raw_id_fields = ("active_run",)


@admin.register(models.Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "agent", "state", "end_cause", "step", "version", "lease_owner")
    list_filter = ("state", "end_cause", "agent")
    search_fields = ("id", "thread__id")
    raw_id_fields = ("thread",)


@admin.register(models.ThreadCommit)
class ThreadCommitAdmin(ReadOnlyAdmin):
    list_display = ("thread", "seq", "run", "actor", "created_at")
    search_fields = ("thread__id", "run__id")
    raw_id_fields = ("thread", "run")


@admin.register(models.ToolCallRecord)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "name", "phase", "attempt", "policy", "operation_id")
    list_filter = ("phase", "policy", "name")
    search_fields = ("id", "operation_id", "run__id")
    raw_id_fields = ("run",)


@admin.register(models.Ticket)
class TicketAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "kind", "state", "created_at", "closed_by")
    list_filter = ("kind", "state")
    raw_id_fields = ("run", "call")


@admin.register(models.ReconciliationRecord)
class ReconciliationAdmin(ReadOnlyAdmin):
    list_display = ("call", "outcome", "actor", "seq", "created_at")
    list_filter = ("outcome",)
    raw_id_fields = ("thread", "call")


@admin.register(models.MessageRecord)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ("thread", "seq", "idx", "role", "run")
    raw_id_fields = ("thread", "run")


@admin.register(models.LateEvidence)
class LateEvidenceAdmin(ReadOnlyAdmin):
    list_display = ("call", "is_error", "worker", "created_at")
    raw_id_fields = ("call",)


@admin.register(models.WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdmin):
    list_display = ("id", "host", "pid", "version", "heartbeat_at", "stopped_at")
