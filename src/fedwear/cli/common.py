"""Helpers shared by the command modules: one-line errors, console logging, ``--set``."""

from __future__ import annotations

import logging
import shlex
import sys
from collections.abc import Iterable
from typing import Annotated, NoReturn

import typer

from fedwear.errors import FedwearError

SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override a config key: --set rounds=10")]


def fail(e: Exception | str) -> NoReturn:
    """Print ``error: <message>`` on one line (no traceback) and exit with status 2."""
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


def command_line(command: str, args: list[str], options: Iterable[tuple[str, object]]) -> str:
    """``command`` with its arguments and each option whose value is not None, shell-quoted: how a
    results file or report states the command that made it."""
    for flag, value in options:
        if value is not None:
            args = [*args, flag] if value is True else [*args, flag, str(value)]
    return f"{command} " + " ".join(shlex.quote(a) for a in args)


def console_logging(quiet: bool) -> None:
    """fedwear's warnings (errors only with ``quiet``) on stderr, attached once."""
    log = logging.getLogger("fedwear")
    if not any(getattr(h, "_fedwear_console", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setLevel(logging.ERROR if quiet else logging.WARNING)
        h.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        h._fedwear_console = True  # type: ignore[attr-defined]
        log.addHandler(h)


def name_list(text: str) -> list[str]:
    """The comma-separated names of ``text`` (blanks dropped)."""
    return [s.strip() for s in text.split(",") if s.strip()]


def int_list(option: str, text: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise FedwearError(f"{option} {text!r}: expected comma-separated integers, e.g. {option} 0,1,2") from None
    if not values:
        raise FedwearError(f"{option}: give at least one value, e.g. {option} 0")
    return values
