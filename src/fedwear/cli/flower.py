"""``fedwear flower ...``: certificates, SuperLink, SuperNodes and runs of a Flower deployment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedwear.cli.common import fail
from fedwear.errors import FedwearError

flower_app = typer.Typer(no_args_is_help=True, help="Deploy on Flower: SuperLink, SuperNodes, runs.")

CaOpt = Annotated[Path | None, typer.Option("--root-certificates", help="CA certificate (TLS); omit with --insecure")]


def _tls(ca: Path | None, insecure: bool) -> Path | None:
    if ca is None and not insecure:
        raise FedwearError("give --root-certificates CA.crt for TLS, or --insecure for a plain-text test setup")
    return None if insecure else ca


@flower_app.command("certs")
def flower_certs(folder: Path, host: Annotated[list[str] | None, typer.Option(help="host names/IPs of the SuperLink")] = None) -> None:
    """Make a local CA and a SuperLink certificate (for tests and trials; use real certificates in production)."""
    from fedwear.engines.flower_cli import make_certs

    try:
        files = make_certs(folder, host or ["localhost", "127.0.0.1"])
    except FedwearError as e:
        fail(e)
    typer.echo("\n".join(str(f) for f in files))


@flower_app.command("app")
def flower_app_cmd(folder: Path) -> None:
    """Write the Flower app folder (a pyproject naming fedwear's ServerApp and ClientApp)."""
    from fedwear.engines.flower_cli import write_app

    typer.echo(write_app(folder))


@flower_app.command("superlink")
def flower_superlink(
    certs: Annotated[Path | None, typer.Option(help="folder with ca.crt, server.crt, server.key")] = None,
    insecure: Annotated[bool, typer.Option(help="no TLS (local tests only)")] = False,
    host: str = "127.0.0.1",
    port: int = 8000,
) -> None:
    """Start Flower's SuperLink (TLS with --certs)."""
    from fedwear.engines.flower_cli import superlink_command

    def command() -> list[str]:
        if certs is None and not insecure:
            raise FedwearError("give --certs DIR (see fedwear flower certs) or --insecure")
        return superlink_command(None if insecure else certs, host, port)

    _run_flower_process(command, f"superlink-{port}")


@flower_app.command("client")
def flower_client(
    config: Path,
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port")] = "127.0.0.1:8000",
    data_root: Annotated[Path | None, typer.Option(help="this node's own data (overrides dataset.root)")] = None,
    client: Annotated[str | None, typer.Option(help="client id to play when the root holds several")] = None,
    role: Annotated[str, typer.Option(help="train, or new (held out: evaluated after adaptation)")] = "train",
    ca: CaOpt = None,
    insecure: Annotated[bool, typer.Option(help="no TLS (local tests only)")] = False,
    port: Annotated[int, typer.Option(help="this node's local API port (unique per node on one host)")] = 9094,
) -> None:
    """Start a SuperNode that plays one client with its own data only."""
    from fedwear.engines.flower_cli import supernode_command

    _run_flower_process(
        lambda: supernode_command(config, superlink, _tls(ca, insecure), port, data_root, client, role),
        f"node-{port}",
    )


def _run_flower_process(command, home_tag: str) -> None:
    """Build a Flower command (user errors: one line) and run it in the foreground, own FLWR_HOME."""
    from fedwear.engines.flower_cli import default_home, flower_env, run_foreground

    try:
        cmd = command()
    except FedwearError as e:
        fail(e)
    raise typer.Exit(run_foreground(cmd, flower_env(default_home(home_tag))))


@flower_app.command("serve")
def flower_serve(
    config: Path,
    out: Annotated[Path, typer.Option(help="run directory (written by the ServerApp)")],
    nodes: Annotated[int, typer.Option(help="SuperNodes to wait for before round 1")],
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port")] = "127.0.0.1:8000",
    ca: CaOpt = None,
    insecure: Annotated[bool, typer.Option(help="no TLS (local tests only)")] = False,
) -> None:
    """Run CONFIG on a running SuperLink and its SuperNodes; streams the run's log."""
    from fedwear.engines.flower_cli import default_home, run_foreground, serve_command

    try:
        cmd, env = serve_command(config, out, nodes, superlink, _tls(ca, insecure), default_home("serve"))
    except FedwearError as e:
        fail(e)
    code = run_foreground(cmd, env)
    if code == 0 and (out / "summary.json").exists():
        from fedwear.report.tables import summary_table

        typer.echo(summary_table(json.loads((out / "summary.json").read_text())))
    raise typer.Exit(code)


