"""The documentation site builds strictly (any MkDocs warning fails), with its reference pages
generated from the code by docs/hooks.py, and the README stays a short front page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the hook sets up console.settings itself
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for page in ("settings", "commands", "api", "errors", "metrics"):
        html = (tmp_path / "site" / "reference" / page / "index.html").read_text()
        assert "Generated" in html, page
    commands = (tmp_path / "site" / "reference" / "commands" / "index.html").read_text()
    assert "--max-inflight" in commands and "runtime_worker" in commands
    settings = (tmp_path / "site" / "reference" / "settings" / "index.html").read_text()
    assert "RUNTIME_LEASE_SECONDS" in settings


def test_the_readme_is_a_front_page_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "```sh\n./scripts/start\n```" in text and "```sh\n./scripts/test\n```" in text
