"""Helpers shared by the command modules: one-line errors, console logging, ``--set``."""

from __future__ import annotations

import errno
import inspect
import io
import logging
import os
import shlex
import shutil
import sys
import textwrap
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Annotated, NoReturn

import typer

from fedwear.errors import NO_ACCESS, NO_SPACE, FedwearError

SetOpt = Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help="override a config key: --set rounds=10")]


def reflow_help(app: typer.Typer) -> None:
    """Give each command of ``app`` (and of its groups) its docstring with the paragraphs' line
    breaks removed: typer's --help keeps the breaks after the first paragraph, which then wrap
    raggedly in a terminal narrower than the source."""
    for info in app.registered_commands:
        if info.help is None and info.callback is not None and info.callback.__doc__:
            paragraphs = inspect.cleandoc(info.callback.__doc__).split("\n\n")
            info.help = "\n\n".join(" ".join(p.split()) for p in paragraphs)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)


def echo_listing(text: str, indent: int) -> None:
    """One entry of a listing: wrapped to a terminal's width, continuation lines indented by
    ``indent``; whole when piped (so that grep finds it on one line)."""
    if sys.stdout.isatty():
        text = textwrap.fill(text, shutil.get_terminal_size().columns, subsequent_indent=" " * indent,
                             break_on_hyphens=False)
    typer.echo(text)


def fail(e: Exception | str) -> NoReturn:
    """Print ``error: <message>`` on one line (no traceback) and exit with status 2."""
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


@contextmanager
def one_line_errors(ctrl_c: bool = False, grid: str | None = None) -> Iterator[None]:
    """A FedwearError raised inside ends the command as :func:`fail` does; with ``ctrl_c``, a
    Ctrl-C as :func:`interrupted` does (``grid``: how a grid of runs goes on)."""
    try:
        yield
    except FedwearError as e:
        fail(e)
    except KeyboardInterrupt as e:
        if not ctrl_c:
            raise
        interrupted(e, grid)


#: Errors of the file system rather than of fedwear (a full disk, no write access, and a few more):
#: the user frees space, fixes permissions or picks another folder. Other ``OSError`` values (a
#: missing file fedwear should have written, say) are bugs and keep their traceback; missing or
#: unreadable data files are DataErrors already.
FILE_SYSTEM = NO_SPACE | NO_ACCESS | {errno.EIO, errno.ENOTDIR, errno.ENAMETOOLONG, errno.EMFILE, errno.ENFILE}


def file_system_error(e: OSError) -> str | None:
    """The one line for a file-system error (:data:`FILE_SYSTEM`) naming the path, e.g.
    ``cannot write runs/x/metrics.csv: No space left on device (errno 28)``; None for any other
    ``OSError``."""
    if e.errno not in FILE_SYSTEM:
        return None
    path = e.filename if e.filename is not None else _file_in_flight(e.__traceback__)
    reason = f"{e.strerror or os.strerror(e.errno)} (errno {e.errno})"
    if e.errno in NO_SPACE:
        return f"cannot write {path}: {reason}: free some space or pass --out with a folder on another disk"
    if e.errno in NO_ACCESS:
        return f"{path}: permission denied ({reason}): pass --out with a writable folder"
    return f"{path}: {reason}"


def _file_in_flight(tb: TracebackType | None) -> str:
    """The file being written where ``tb`` ends: a failed ``write`` (a full disk) raises without
    a file name, so the innermost frame holding an open file names it; "a file" if none does."""
    for frame, _ in reversed(list(traceback.walk_tb(tb))):
        for value in frame.f_locals.values():
            if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str):
                return value.name
    return "a file"


def command_line(command: str, args: list[str], options: Iterable[tuple[str, object]]) -> str:
    """``command`` with its arguments and each option whose value is not None, shell-quoted: how a
    results file or report states the command that made it."""
    for flag, value in options:
        if value is not None:
            args = [*args, flag] if value is True else [*args, flag, str(value)]
    return f"{command} " + " ".join(shlex.quote(a) for a in args)


def console_logging() -> None:
    """fedwear's warnings and errors on stderr, attached once: ``--quiet`` hides progress bars only,
    a warning (damaged data, a client left out) is never hidden."""
    log = logging.getLogger("fedwear")
    if not any(getattr(h, "_fedwear_console", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setLevel(logging.WARNING)
        h.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        h._fedwear_console = True  # type: ignore[attr-defined]
        log.addHandler(h)


def name_list(text: str) -> list[str]:
    """The comma-separated names of ``text`` (blanks dropped)."""
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_seeds(option: str, text: str) -> list[int]:
    """The comma-separated seeds of ``text``, each checked against the range every generator
    accepts (0 .. 2**64-1, :data:`fedwear.seeding.SEED_MAX`); a one-line FedwearError naming
    ``option`` as the user typed it if one is not such an integer or there are none."""
    from fedwear.seeding import SEED_MAX

    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise FedwearError(f"{option} {text!r}: expected comma-separated integers, e.g. {option} 0,1,2") from None
    if not values:
        raise FedwearError(f"{option}: give at least one value, e.g. {option} 0")
    if bad := [v for v in values if not 0 <= v <= SEED_MAX]:
        raise FedwearError(f"{option} {text!r}: seed {bad[0]} is out of range; seeds are 0 .. 2**64-1 "
                           f"({SEED_MAX})")
    return values


def check_method_names(option: str, names: list[str]) -> None:
    """A one-line FedwearError naming ``option`` (not a ``--set`` the user never typed) when a
    name is not a method, with the closest ones."""
    from fedwear.methods import METHODS, unknown_method

    for name in names:
        if name not in METHODS:
            raise FedwearError(f"{option}: {unknown_method(name)}")


#: How an interrupted grid of runs (compare, reproduce) goes on.
GRID_GOES_ON = "continue with the same command (finished runs are reused, the others resume)"


def interrupted(e: BaseException, grid: str | None = None) -> NoReturn:
    """Exit 130 after Ctrl-C, saying what the run saved (:class:`fedwear.api.RunInterrupted`
    knows) and, for a grid, how it goes on."""
    from fedwear.api import RunInterrupted

    saved = str(e) if isinstance(e, RunInterrupted) else ""
    if grid is None:
        typer.echo(f"interrupted: {saved or 'before the run started: nothing was written; rerun the same command'}",
                   err=True)
    else:
        typer.echo(f"interrupted: {grid}" + (f" ({saved})" if saved else ""), err=True)
    raise typer.Exit(130) from None


def announce(status: object, where: Path) -> None:
    """A grid's line as each run ends (``on_done`` of :func:`fedwear.compare.run_grid`)."""
    typer.echo(f"[{status}] {where} done", err=True)


#: Option groups of the longer commands' --help.
PARALLEL, OUTPUT, CLAIMS = "Parallel runs", "Output", "Claims ledger"

ExecutorOpt = Annotated[str, typer.Option(
    help="local (this machine's processes, --jobs), together (the runs in this process, their clients trained "
    "together as one population; engine: batched), ray (one task per run on an existing Ray cluster: "
    "--ray-address or $RAY_ADDRESS) or slurm (one Slurm job per run, from a login node: --slurm)",
    rich_help_panel=PARALLEL)]
RayAddressOpt = Annotated[str | None, typer.Option(
    help="--executor ray: the cluster's address (host:port, or auto: the one running here); default "
    "$RAY_ADDRESS, else auto", rich_help_panel=PARALLEL)]
SlurmOpt = Annotated[list[str] | None, typer.Option(
    "--slurm", metavar="KEY=VALUE", help="--executor slurm: an sbatch option as submitit names it, e.g. "
    "--slurm partition=cpu --slurm time=600 (minutes)", rich_help_panel=PARALLEL)]


def executor_options(executor: str, slurm: list[str] | None) -> dict[str, str]:
    """Check ``--executor`` and turn ``--slurm key=value`` options into a dict."""
    from fedwear.compare import EXECUTORS

    if executor not in EXECUTORS:
        raise FedwearError(f"--executor {executor!r}: use {', '.join(EXECUTORS)}")
    if slurm and executor != "slurm":
        raise FedwearError("--slurm is for --executor slurm: add --executor slurm, or drop --slurm")
    options = {}
    for item in slurm or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise FedwearError(f"--slurm {item!r}: write key=value, e.g. --slurm partition=cpu")
        options[key.strip().replace("-", "_")] = value.strip()
    return options
