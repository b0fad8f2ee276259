"""Issue 30, item 2: the wheel works with no extras and with each extra on its own.

Each test builds a virtualenv that has nothing but the wheel and what it asks for
(``python -m venv --without-pip``, no system site packages; the suite's pip installs into it
with ``--no-index --find-links <wheelhouse>`` and no pip configuration, so nothing comes from
anywhere else), makes a project with ``django-admin startproject mysite``, adds the runtime
as README "Add it to your project" says (tests/test_foreign_project.py's helpers read its
blocks), migrates, starts the guide's ``notes`` agent, runs ``runtime_worker --until-idle``,
approves its ticket with ``runtime_resume`` and runs the worker again: the run completes.

The wheelhouse holds the wheels of the versions the suite has installed (pinned by
constraints read from the suite's own distributions, so the venv gets what the suite tested).
It is made once by ``pip download`` (the one step that may use the network: an installed
distribution cannot be turned back into a wheel) and kept under ``var/wheelhouse``; later
runs resolve it offline (``pip download --no-index`` against the folder itself succeeds only
when every wheel is there) and go to the index only for what is missing. A file lock keeps
xdist workers from filling it at once.

The database is the project's own SQLite file: what an extra brings does not depend on the
database, so on the PostgreSQL pass of the suite (DATABASE_URL set) these tests skip.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.model_server import model_server
from tests.test_foreign_project import ROOT, build_wheel, python_block

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")),
        reason="the extras do not depend on the database: the SQLite pass covers them",
    ),
]

DISTRIBUTION = "durable-agent-runtime"
WHEELHOUSE = ROOT / "var" / "wheelhouse"

# The module an extra brings -> the extra (runtime.extras.MODULES, plus the project extra's).
OPTIONAL = {
    "openai": "openai",
    "anthropic": "anthropic",
    "mcp": "mcp",
    "opentelemetry.sdk": "otel",
    "channels_redis": "redis",
    "whitenoise": "project",
    "dj_database_url": "project",
}

PROBE = (
    "import importlib.util, json\n"
    "def found(name):\n"
    "    try:\n"
    "        return importlib.util.find_spec(name) is not None\n"
    "    except ModuleNotFoundError:\n"
    "        return False\n"
    f"print(json.dumps(sorted(m for m in {sorted(OPTIONAL)!r} if found(m))))\n"
)


def pip_env(*, offline: bool) -> dict[str, str]:
    """The environment of a pip call: with ``offline``, no pip configuration at all (no
    index, find-links or constraints of this machine's), so only the wheelhouse is seen."""
    env = {k: v for k, v in os.environ.items() if not (offline and k.startswith("PIP_"))}
    if offline:
        env["PIP_CONFIG_FILE"] = os.devnull
    return env


def constraints(into: Path) -> Path:
    """A constraints file pinning every distribution the suite has installed but this one."""
    pins = sorted(
        {
            f"{dist.metadata['Name']}=={dist.version}"
            for dist in importlib.metadata.distributions()
            if dist.metadata["Name"] and dist.metadata["Name"].lower() != DISTRIBUTION
        }
    )
    path = into / "constraints.txt"
    path.write_text("\n".join(pins) + "\n")
    return path


def fill_wheelhouse(wheel: Path, pins: Path) -> Path:
    """``WHEELHOUSE`` holding a wheel of every dependency of ``wheel[all,project]`` at the
    pinned versions: checked offline, downloaded only when something is missing."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    wanted = f"{wheel}[all,project]"
    download = [sys.executable, "-m", "pip", "download", "-q", "-d", str(WHEELHOUSE)]
    download += ["-c", str(pins), "--only-binary", ":all:", wanted]
    with open(WHEELHOUSE.parent / "wheelhouse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        offline = subprocess.run(
            [*download, "--no-index", "--find-links", str(WHEELHOUSE)],
            env=pip_env(offline=True),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if offline.returncode != 0:
            online = subprocess.run(
                download, env=pip_env(offline=False), capture_output=True, text=True, timeout=600
            )
            assert online.returncode == 0, online.stderr[-3000:]
        for ours in WHEELHOUSE.glob("durable_agent_runtime-*.whl"):
            ours.unlink()  # the wheel under test is installed by its path, never from here
    return WHEELHOUSE


@pytest.fixture(scope="module")
def wheel_and_house(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(folder / "dist")
    return wheel, fill_wheelhouse(wheel, constraints(folder))


class Site:
    """A fresh ``startproject`` in a virtualenv holding the wheel with ``extra`` (or none)."""

    def __init__(self, folder: Path, wheel: Path, house: Path, extra: str) -> None:
        self.folder = folder / "site"
        venv = folder / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        self.python = venv / "bin" / "python"
        install = [sys.executable, "-m", "pip", "--python", str(self.python), "install", "-q"]
        # No byte-compiling of every installed file: the project's processes compile (and
        # keep) what they import, a fraction of it.
        install += ["--no-index", "--find-links", str(house), "--no-compile"]
        done = subprocess.run(
            [*install, f"{wheel}[{extra}]" if extra else str(wheel)],
            env=pip_env(offline=True),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "RUNTIME_", "DATABASE_URL", "OTEL_", "PYTHON"))
        }
        self.env.update(DJANGO_SETTINGS_MODULE="mysite.settings")
        self.folder.mkdir()
        self.run("-m", "django", "startproject", "mysite", str(self.folder))
        self.add_the_runtime()

    def add_the_runtime(self) -> None:
        """README "Add it to your project", steps 2 to 4, as written there."""
        package = self.folder / "mysite"
        settings = package / "settings.py"
        settings.write_text(settings.read_text() + python_block("mysite/settings.py"))
        urls = package / "urls.py"
        lines = python_block("mysite/urls.py").splitlines()[1:]
        text = urls.read_text().replace(
            "from django.urls import path", "from django.urls import include, path"
        )
        urls.write_text(text.rstrip().removesuffix("]") + "\n".join(lines) + "\n]\n")
        (package / "asgi.py").write_text(python_block("mysite/asgi.py"))
        (package / "agents.py").write_text(python_block("mysite/agents.py") + JOT)
        self.settle('RUNTIME_AGENTS += ["mysite.agents.jot"]\n')

    def settle(self, text: str) -> None:
        """Append ``text`` to the project's settings."""
        settings = self.folder / "mysite" / "settings.py"
        settings.write_text(settings.read_text() + "\n" + text)

    def call(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.python), *args],
            cwd=self.folder,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=180,
        )

    def run(self, *args: str, **env: str) -> str:
        done = self.call(*args, **env)
        assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def manage(self, *args: str, **env: str) -> str:
        return self.run("manage.py", *args, **env)

    def optional_modules(self) -> list[str]:
        """The optional modules (OPTIONAL) this virtualenv can import."""
        return json.loads(self.run("-c", PROBE))

    def runs(self) -> int:
        count = "from runtime.models import Run; print(Run.objects.count())"
        return int(self.manage("shell", "-c", count).split()[-1])  # after Django's banner

    def run_agent(self, agent: str, **env: str) -> tuple[dict, str]:
        """Start ``agent`` on "buy milk" (``runtime_start`` runs the system checks first) and
        work until idle: the run's document and the worker's output (stdout and stderr)."""
        run_id = self.manage("runtime_start", "--agent", agent, "--input", "buy milk", **env)
        worked = self.call("manage.py", "runtime_worker", "--until-idle", **env)
        assert worked.returncode == 0, worked.stderr
        run_id = run_id.split()[0]  # the console span exporter prints after it
        document = json.loads(self.manage("runtime_show", run_id, "--json"))
        return document, worked.stdout + "\n" + worked.stderr


@pytest.fixture
def site(tmp_path: Path, wheel_and_house: tuple[Path, Path]) -> Callable[[str], Site]:
    def make(extra: str) -> Site:
        made = Site(tmp_path, *wheel_and_house, extra)
        made.manage("migrate", "-v0")
        return made

    return make


def completed(document: dict, answer: str = "The note is sent.") -> None:
    assert (document["state"], document["end_cause"]) == ("ended", "natural"), document
    assert answer in json.dumps(document), document


# Appended to the guide's mysite/agents.py: its model and tool, with a tool nobody has to
# approve, so that one worker pass runs the agent to its end.
JOT = """

@tool(name="send_note", policy=RecoveryPolicy.INDETERMINATE)
def send_note_unasked(ctx: ToolContext, text: str) -> dict:
    \"\"\"Send a note without asking.\"\"\"
    return {"sent": text}


def jotter(kind: str, **config) -> Agent:
    return Agent(
        name="jot" if kind == "echo" else f"jot_{kind}",
        instructions="Send the user's message as a note.",
        tools=(send_note_unasked,),
        provider=ProviderConfig(kind=kind, **config),
    )


jot = jotter("echo")
"""


def test_the_wheel_with_no_extras_runs_an_agent_and_names_a_missing_extra(site) -> None:
    host = site("")
    assert host.optional_modules() == []  # nothing of any extra, nor of the project extra
    document, output = host.run_agent("jot")
    completed(document)
    assert "Traceback" not in output, output

    # Tracing asked for without the otel extra: refused in one line naming both, no run saved.
    before = host.runs()
    refused = host.call(
        "manage.py", "runtime_start", "--agent", "jot", "--input", "x",
        OTEL_TRACES_EXPORTER="console",
    )  # fmt: skip
    assert refused.returncode != 0
    assert "Traceback" not in refused.stderr, refused.stderr
    (line,) = [line for line in refused.stderr.splitlines() if "runtime.E006" in line]
    assert "'otel' extra" in line and "OTEL_TRACES_EXPORTER=console" in line, line
    assert host.runs() == before


def test_the_wheel_with_the_openai_extra_runs_an_openai_compatible_agent(site) -> None:
    host = site("openai")
    assert host.optional_modules() == ["openai"]
    with model_server([("send_note", {"text": "buy milk"})]) as server:
        host.settle(
            f"from mysite import agents\n"
            f"agents.jot_openai = agents.jotter('openai', model='m', base_url={server.url!r})\n"
            'RUNTIME_AGENTS += ["mysite.agents.jot_openai"]\n'
        )
        document, output = host.run_agent("jot_openai", OPENAI_API_KEY="sk-test")
    completed(document, "all done")
    assert server.requests == 2
    assert "Traceback" not in output, output


def test_the_wheel_with_the_otel_extra_traces_a_run(site) -> None:
    host = site("otel")
    assert host.optional_modules() == ["opentelemetry.sdk"]
    document, output = host.run_agent("jot", OTEL_TRACES_EXPORTER="console")
    completed(document)
    assert '"name": "run.drive"' in output, output  # the console exporter's spans


@pytest.mark.parametrize(
    ("extra", "module", "setting"),
    [
        (
            "anthropic",
            "anthropic",
            "from mysite import agents\n"
            "agents.jot_anthropic = agents.jotter('anthropic', model='m')\n"
            'RUNTIME_AGENTS += ["mysite.agents.jot_anthropic"]\n',
        ),
        (
            "redis",
            "channels_redis",
            "CHANNEL_LAYERS = {'default': {'BACKEND': 'channels_redis.core.RedisChannelLayer',"
            " 'CONFIG': {'hosts': [%r]}}}\n",
        ),
        ("mcp", "mcp", ""),
    ],
)
def test_the_wheel_with_one_more_extra_passes_the_checks_and_runs_an_agent(
    site, extra: str, module: str, setting: str
) -> None:
    """The extra alone is installed, a setting that needs it passes the system checks (which
    ``runtime_start`` runs), and an agent runs to its end."""
    redis_url = os.environ.get("RUNTIME_TEST_REDIS_URL", "")
    if extra == "redis" and not redis_url:
        pytest.skip("a Redis channel layer needs a Redis: RUNTIME_TEST_REDIS_URL (CI sets it)")
    host = site(extra)
    assert host.optional_modules() == [module]
    host.settle(setting % redis_url if extra == "redis" else setting)
    document, _ = host.run_agent("jot", ANTHROPIC_API_KEY="sk-test")
    completed(document)
