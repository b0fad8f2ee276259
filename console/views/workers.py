"""Workers: every registered worker process, whether it is alive, and the runs it holds.

A worker silent for more than two lease periods is flagged stale: it was killed or lost its
database, and its runs go to the next worker when their leases expire (``runtime.registry``).
"""

from __future__ import annotations

from django.http import HttpResponse

from console.models import READ
from console.views.common import HtmxHttpRequest, needs, render_page
from runtime import inventory, limits, versions


@needs(READ)
def workers(request: HtmxHttpRequest) -> HttpResponse:
    """The Workers page, with the agents' versions each worker carries, the runs no live
    worker may drive and each limit's use; its list re-renders alone every few seconds
    (htmx)."""
    rows = inventory.worker_rows()
    counts = {status: sum(r.status == status for r in rows) for status in ("live", "stale")}
    context = {
        "rows": rows,
        "counts": counts,
        "stale_after": int(inventory.stale_after().total_seconds()),
        "limits": limits.usage(),
        "unserved": versions.without_a_worker(),
        "cap": versions.COUNT_CAP,
    }
    return render_page(request, "console/workers.html", context, partial="workers")
