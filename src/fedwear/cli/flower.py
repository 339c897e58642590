"""``fedwear flower ...``: certificates, SuperLink, SuperNodes and runs of a Flower deployment."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from fedwear import files
from fedwear.cli.common import one_line_errors
from fedwear.errors import FedwearError

flower_app = typer.Typer(no_args_is_help=True, help="Deploy on Flower: SuperLink, SuperNodes, runs.")

CaOpt = Annotated[Path | None, typer.Option("--root-certificates", help="CA certificate (TLS); omit with --insecure")]


def _tls(ca: Path | None, insecure: bool) -> Path | None:
    if ca is None and not insecure:
        raise FedwearError("give --root-certificates CA.crt for TLS, or --insecure for a plain-text test setup")
    return None if insecure else ca


NodeKeyOpt = Annotated[Path | None, typer.Option(
    "--node-key", help="this SuperNode's private key (SuperNode authentication; see fedwear flower node-keys)")]


@flower_app.command("certs")
def flower_certs(
    folder: Path,
    host: Annotated[list[str] | None, typer.Option(help="host names/IPs of the SuperLink")] = None,
    nodes: Annotated[int, typer.Option(min=0, metavar="N", help="also make N SuperNode key pairs in FOLDER/nodes (node1..nodeN)")] = 0,
) -> None:
    """Make a local CA and a SuperLink certificate (for tests and trials; use real certificates in production)."""
    from fedwear.cli.flower_processes import make_certs, make_node_keys

    with one_line_errors():
        files = make_certs(folder, host or ["localhost", "127.0.0.1"])
        files += make_node_keys(folder / "nodes", [f"node{i}" for i in range(1, nodes + 1)])
    typer.echo("\n".join(str(f) for f in files))


@flower_app.command("node-keys")
def flower_node_keys(
    folder: Path,
    names: Annotated[list[str], typer.Argument(help="one key pair per name: NAME.key (private) and NAME.pub")],
) -> None:
    """Make SuperNode key pairs for SuperNode authentication (existing ones are kept).

    Give NAME.key to that SuperNode only (fedwear flower client --node-key) and NAME.pub to the
    SuperLink (fedwear flower superlink --node-keys).
    """
    from fedwear.cli.flower_processes import make_node_keys

    with one_line_errors():
        files = make_node_keys(folder, names)
    typer.echo("\n".join(str(f) for f in files))


@flower_app.command("app")
def flower_app_cmd(folder: Path) -> None:
    """Write the Flower app folder (a pyproject naming fedwear's ServerApp and ClientApp)."""
    from fedwear.cli.flower_processes import write_app

    typer.echo(write_app(folder))


@flower_app.command("superlink")
def flower_superlink(
    certs: Annotated[Path | None, typer.Option(help="folder with ca.crt, server.crt, server.key")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="no TLS (local tests only)")] = False,
    node_keys: Annotated[list[Path] | None, typer.Option(
        "--node-keys", help="SuperNode authentication: only SuperNodes with these public keys (a .pub file "
        "or a folder of them; repeatable) may connect")] = None,
    host: str = "127.0.0.1",
    port: int = 8000,
) -> None:
    """Start Flower's SuperLink (TLS with --certs; SuperNode authentication with --node-keys)."""
    from fedwear.cli.flower_processes import (
        default_home,
        node_public_keys,
        register_nodes,
        superlink_command,
    )

    def command() -> list[str]:
        if certs is None and not insecure:
            raise FedwearError("give --certs DIR (see fedwear flower certs) or --insecure")
        return superlink_command(None if insecure else certs, host, port, node_auth=bool(node_keys))

    def register(link: subprocess.Popen) -> None:
        """Register the SuperNodes' public keys once the SuperLink process has started (only ever with
        TLS: :func:`command` refuses SuperNode authentication without it, and checks ``certs``)."""
        for key, node_id in register_nodes(node_public_keys(node_keys), host, port, certs / "ca.crt",
                                           default_home(f"register-{port}"), link):
            typer.echo(f"registered SuperNode {node_id}: {key}", err=True)

    _run_flower_process(command, f"superlink-{port}", register if node_keys else None)


@flower_app.command("client")
def flower_client(
    config: Path,
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port")] = "127.0.0.1:8000",
    data_root: Annotated[Path | None, typer.Option(help="this node's own data (overrides dataset.root)")] = None,
    client: Annotated[str | None, typer.Option(help="client id to play when the root holds several")] = None,
    role: Annotated[str, typer.Option(help="train, or new (held out: evaluated after adaptation)")] = "train",
    ca: CaOpt = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="no TLS (local tests only)")] = False,
    port: Annotated[int, typer.Option(help="this node's local API port (unique per node on one host)")] = 9094,
    node_key: NodeKeyOpt = None,
) -> None:
    """Start a SuperNode that plays one client with its own data only."""
    from fedwear.cli.flower_processes import supernode_command

    _run_flower_process(
        lambda: supernode_command(config, superlink, _tls(ca, insecure), port, data_root, client, role, node_key),
        f"node-{port}",
    )


def _run_flower_process(command: Callable[[], list[str]], home_tag: str,
                        after_start: Callable[[subprocess.Popen], None] | None = None) -> None:
    """Build a Flower command (user errors: one line), run it as a child with its own FLWR_HOME
    (signals forwarded to it) and exit with its status."""
    from fedwear.cli.flower_processes import default_home, flower_env, run_child

    with one_line_errors():
        code, _ = run_child(command(), flower_env(default_home(home_tag)), after_start)
    raise typer.Exit(code)


@flower_app.command("serve")
def flower_serve(
    config: Path,
    out: Annotated[Path, typer.Option(help="run directory (written by the ServerApp)")],
    nodes: Annotated[int, typer.Option(help="SuperNodes to wait for before round 1")],
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port")] = "127.0.0.1:8000",
    ca: CaOpt = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="no TLS (local tests only)")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace the run already in --out")] = False,
) -> None:
    """Run CONFIG on a running SuperLink and its SuperNodes; streams the run's log."""
    from fedwear.cli.flower_processes import default_home, is_loopback, run_child, serve_command

    with one_line_errors():
        if is_loopback(superlink) and config.is_file():  # the run directory is on this machine
            from fedwear import rundir
            from fedwear.config import load_config

            rundir.plan(load_config(config, ["engine=flower"]), out, resume=False, overwrite=overwrite)
        cmd, env = serve_command(config, out, nodes, superlink, _tls(ca, insecure), default_home("serve"),
                                 overwrite)
    code, stopped = run_child(cmd, env)
    if stopped:
        typer.echo("stopped following the run; the run itself goes on on the SuperLink", err=True)
    elif code == 0:
        code = _report(out, superlink)
    raise typer.Exit(code)


def _report(out: Path, superlink: str) -> int:
    """Print the summary table and the run directory; 1 if a local run did not finish.

    ``flwr run`` exits with 0 however the run ended, and the ServerApp writes the run directory
    on the SuperLink's machine: its summary is checked only when that machine is this one.
    """
    from fedwear.cli.flower_processes import is_loopback

    summary = out / files.SUMMARY
    if not summary.exists():
        if is_loopback(superlink):
            typer.echo(f"error: the run did not finish: see the log above and {out.resolve() / files.LOG}", err=True)
            return 1
        typer.echo(f"run directory (on the SuperLink's machine): {out.resolve()}")
        return 0
    from fedwear.report.tables import summary_table

    typer.echo(summary_table(json.loads(summary.read_text())))
    typer.echo(f"run directory: {out.resolve()}")
    return 0
