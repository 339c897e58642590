"""The ``fedwear`` command line: run, compare, data, methods, flower."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from fedwear.errors import FedwearError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Personalized federated learning on wearable sensor data.")
data_app = typer.Typer(no_args_is_help=True, help="Datasets: list them, inspect one.")
app.add_typer(data_app, name="data")

SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override a config key: --set rounds=10")]


def _fail(e: Exception) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


def _console_logging(quiet: bool) -> None:
    log = logging.getLogger("fedwear")
    if not any(getattr(h, "_fedwear_console", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setLevel(logging.ERROR if quiet else logging.WARNING)
        h.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        h._fedwear_console = True  # type: ignore[attr-defined]
        log.addHandler(h)


@app.command()
def run(
    config: Path,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(help="run directory (default runs/<dataset>-<method>-s<seed>-<hash>)")] = None,
    resume: Annotated[bool, typer.Option(help="continue from the run directory's last checkpoint")] = False,
    quiet: Annotated[bool, typer.Option(help="no progress bar (CI, scripts)")] = False,
) -> None:
    """Run one experiment from a YAML config."""
    from fedwear.api import run as run_api
    from fedwear.config import load_config
    from fedwear.report.tables import summary_table

    _console_logging(quiet)
    try:
        cfg = load_config(config, set_ or [])
        result = run_api(cfg, out, resume=resume, quiet=quiet)
    except FedwearError as e:
        _fail(e)
    except KeyboardInterrupt:
        typer.echo("interrupted: continue with the same command plus --resume", err=True)
        raise typer.Exit(130) from None
    typer.echo(summary_table(result.summary))
    typer.echo(f"run directory: {result.out_dir}")


@app.command()
def compare(
    config: Path,
    methods: Annotated[str, typer.Option(help="comma-separated methods, e.g. fedavg,fedprox,local")],
    seeds: Annotated[str, typer.Option(help="comma-separated seeds")] = "0",
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(help="folder for the runs and the table")] = None,
    select: Annotated[str, typer.Option(help="final or best")] = "final",
    quiet: Annotated[bool, typer.Option(help="no progress bars")] = False,
) -> None:
    """Run several methods x seeds on one config; write a mean +- std table (Markdown and CSV)."""
    from fedwear.api import run as run_api
    from fedwear.config import load_config
    from fedwear.report.tables import comparison_table

    _console_logging(quiet)
    try:
        if select not in ("final", "best"):
            raise FedwearError(f"--select {select!r}: use final or best")
        names = [m.strip() for m in methods.split(",") if m.strip()]
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        base = load_config(config, set_ or [])
        root = out or Path("runs") / f"compare-{Path(config).stem}"
        summaries: dict[str, list[dict]] = {}
        for name in names:
            load_config(config, [*(set_ or []), f"method={name}"])  # validate every method up front
        for name in names:
            for seed in seed_list:
                cfg = load_config(config, [*(set_ or []), f"method={name}", f"seed={seed}"])
                res = run_api(cfg, root / f"{name}-s{seed}", quiet=quiet)
                summaries.setdefault(name, []).append(res.summary)
        md, frame = comparison_table(summaries, select, base)
    except (FedwearError, ValueError) as e:
        _fail(e)
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.md").write_text(md + "\n")
    frame.to_csv(root / "table.csv", index=False)
    typer.echo(md)
    typer.echo(f"\ntable: {root / 'table.md'} and {root / 'table.csv'}")


@data_app.command("list")
def data_list() -> None:
    """Datasets fedwear can read."""
    from fedwear.data import DATASETS

    for name, entry in DATASETS.items():
        typer.echo(f"{name:12s} {entry.DESCRIPTION}")


@data_app.command("info")
def data_info(name: str, root: Annotated[Path | None, typer.Option(help="folder with the dataset's files")] = None) -> None:
    """Subjects, recordings, samples and label counts of a dataset."""
    from fedwear.data import dataset_info

    try:
        info = dataset_info(name, str(root) if root else None)
    except FedwearError as e:
        _fail(e)
    typer.echo(json.dumps(info, indent=2, default=str))


@app.command("methods")
def methods_cmd() -> None:
    """Methods with one-line descriptions and their options."""
    from fedwear.methods import METHODS

    for name, cls in METHODS.items():
        typer.echo(f"{name:12s} {cls.summary}")
        for opt, field in cls.Options.model_fields.items():
            typer.echo(f"{'':12s}   {name}.{opt} = {field.default!r}: {field.description or ''}")


flower_app = typer.Typer(no_args_is_help=True, help="Deploy on Flower: SuperLink, SuperNodes, runs.")
app.add_typer(flower_app, name="flower")
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
        _fail(e)
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
        _fail(e)
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
        _fail(e)
    code = run_foreground(cmd, env)
    if code == 0 and (out / "summary.json").exists():
        from fedwear.report.tables import summary_table

        typer.echo(summary_table(json.loads((out / "summary.json").read_text())))
    raise typer.Exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
