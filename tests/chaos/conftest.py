"""Fixtures of the chaos test: the API's users and the subprocess environment."""

from __future__ import annotations

from tests.api.conftest import make_user, subprocess_env  # noqa: F401
