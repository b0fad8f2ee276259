"""Fixtures of the hostile-input tests: the runtime's and the API's own factories."""

from __future__ import annotations

from tests.api.conftest import api, api_as, make_user  # noqa: F401
from tests.runtime.conftest import (  # noqa: F401
    command,
    manage,
    start,
    subprocess_env,
    work_inline,
)
