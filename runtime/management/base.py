"""The base of the project's management commands: every refusal is one line on stderr.

Django prints a CommandError as one line (``CommandError: ...``) and exits with its
``returncode``. ``RuntimeCommand`` turns what else a command meets at its edges into such a
refusal, for every command at once (issue 21: each of these printed a traceback):

- an argument that is not text a database or a stream can take (bytes that are not UTF-8
  reach Python as lone surrogates, ``runtime_token $'\\xff'``): exit 2, naming the argument;
- a database error (an unmigrated database's ``no such table``, an unreachable server):
  exit 1 with its first line, and ``manage.py migrate`` when migrations are unapplied;
- a reader that stops reading (``runtime_show RUN | head -1``): exit 1 quietly, as a
  command whose output nobody reads has nothing left to say.

A long-lived command (``leaves_at_exit``: the worker, the server) run as its process's own
command leaves with ``leave()`` once it has stopped, instead of through the interpreter's
teardown (see ``leave``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from runtime.db import unapplied_migrations
from runtime.untrusted import text_problem


def argument_problem(value: str) -> str | None:
    """Say why ``value`` (one command-line argument) is refused, or return None."""
    problem = text_problem(value)
    if problem is None or "\x00" in value:
        return problem
    return "is not valid UTF-8 text"


def database_refusal(exc: DatabaseError) -> str:
    """One line for a database error: its first line, and what to do when the database has
    unapplied migrations (asked only now, and only as far as the database answers)."""
    first = next(iter(str(exc).strip().splitlines()), "") or type(exc).__name__
    try:
        unapplied = unapplied_migrations()
    except DatabaseError:  # unreachable as well: its own first line says enough
        unapplied = []
    if unapplied:
        return (
            f"database error: {first}; the database is not migrated ({len(unapplied)}"
            " migrations unapplied): run manage.py migrate first"
        )
    return f"database error: {first}"


class RuntimeCommand(BaseCommand):
    """A management command whose refusals are one line on stderr with exit code 1 or 2
    (see the module docstring); subclasses write ``handle`` as usual."""

    labels: dict[str, str] = {}
    # True: run from the command line, the process leaves through ``leave()`` once ``handle``
    # returns (``call_command`` from a host's own process is left alone).
    leaves_at_exit = False

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
        """Django's parser; remembers how each argument is written, to name it in refusals."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        self.labels = {action.dest: _label(action) for action in parser._actions}
        return parser

    def execute(self, *args: Any, **options: Any) -> Any:
        """Refuse arguments that are not text, then run the command; a database error becomes
        a CommandError (exit 1)."""
        for dest, value in options.items():
            for item in value if isinstance(value, list | tuple) else [value]:
                if isinstance(item, str) and (problem := argument_problem(item)):
                    label = self.labels.get(dest, dest)
                    raise CommandError(f"{label} {problem}", returncode=2)
        try:
            return super().execute(*args, **options)
        except DatabaseError as exc:
            raise CommandError(database_refusal(exc)) from exc

    def run_from_argv(self, argv: list[str]) -> None:
        """Run from the command line; a closed stdout ends the command quietly (exit 1)."""
        try:
            super().run_from_argv(argv)
            sys.stdout.flush()  # here, so that a closed pipe is met inside this ``try``
        except BrokenPipeError:
            # Python's own advice (the signal module's notes on SIGPIPE): point stdout at
            # devnull, so that the flush at exit does not fail a second time and print.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        if self.leaves_at_exit:
            leave()


def leave(code: int = 0) -> NoReturn:
    """End the process now with ``code``, once what it must still write is written: the
    spans it buffered (``tracing.shutdown``), its log handlers, stdout and stderr.

    Called when a worker or server has stopped and recorded its stop. The interpreter's own
    teardown then only freed, one by one, the objects of Django, the model SDKs and the
    schemas: about 0.8 s of CPU, which on a loaded machine took 3 to 5 s at load 10 and more
    than 60 s at load 60 between a worker's "stopped" and its exit (issue 21, item 8). It
    also waits for every thread a request or a tool left waiting, which may be for ever.
    """
    from runtime import tracing  # here: the commands that never leave need no tracing

    tracing.shutdown()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone: nothing to say
            stream.flush()
    os._exit(code)


def _label(action: argparse.Action) -> str:
    """``--name`` for an option (its longest spelling), ``USERNAME`` for a positional."""
    if action.option_strings:
        return max(action.option_strings, key=len)
    return str(action.metavar or action.dest.upper())
