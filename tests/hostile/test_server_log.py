"""A failed request reaches the server's stderr (issue 12, item 4: none of the 500s seen was
logged).

The server (``manage.py runtime_serve``, as ``scripts/start`` runs it; daphne's own command
line configures logging by itself) starts on a migrated SQLite file whose folder is then
moved away, so every request that needs the database fails: it is answered 503 (issue 21: a
database fault is never a 500) and the API's logger must report it on stderr. (It refuses to
start on a database it cannot use.) The logger configuration is the LOGGING setting (issue
13); this test pins what issue 12 needs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from tests.servers import ROOT, free_port, serving


def test_a_server_error_is_logged_to_stderr(tmp_path) -> None:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="console.settings")
    folder = tmp_path / "db"
    folder.mkdir()
    env["DATABASE_URL"] = f"sqlite:///{folder / 'db.sqlite3'}"
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=120)
    log, port = tmp_path / "server.log", free_port()
    command = [*manage, "runtime_serve", "--no-worker", "--skip-checks", "--port", str(port)]
    with serving(env, log, command=command, port=port) as url:
        # The port is bound before the server has finished starting (it checks the database
        # after binding, and stops if it cannot use it): wait until it serves, then take the
        # database away.
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/readyz", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        folder.rename(tmp_path / "gone")  # the file can no longer be opened
        headers = {"Authorization": "Bearer rt_x"}  # the token lookup needs the database
        response = httpx.get(f"{url}/api/v1/runs", headers=headers, timeout=30)
        assert response.status_code == 503
        deadline = time.monotonic() + 10
        while "database unavailable in GET /api/v1/runs" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
