"""``fedwear flower ...``: certificates, the app folder, and starting the deployment processes.

Thin wrappers around Flower's own commands (``flower-superlink``, ``flower-supernode``,
``flwr run``); fedwear never grows its own networking.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fedwear.errors import FedwearError
from fedwear.version import __version__

APP_PYPROJECT = """\
[project]
name = "fedwear-app"
version = "{version}"
description = "fedwear on Flower: the ServerApp and ClientApp of an installed fedwear"

[tool.flwr.app]
publisher = "fedwear"

[tool.flwr.app.components]
serverapp = "fedwear.engines.flower_app:server_app"
clientapp = "fedwear.engines.flower_app:client_app"

[tool.flwr.app.config]
config = ""
out = "runs/flower"
nodes = 1
"""

QUIET_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


def flower_env(flwr_home: Path | None = None) -> dict[str, str]:
    env = {**os.environ, **QUIET_ENV}
    bindir = str(Path(sys.executable).parent)  # flower-superexec must be on PATH
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    if flwr_home is not None:
        flwr_home.mkdir(parents=True, exist_ok=True)
        env["FLWR_HOME"] = str(flwr_home)
    return env


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        raise FedwearError(f"{name} not found: install Flower with pip install 'fedwear[flower]'")
    return path


def write_app(folder: Path) -> Path:
    """The Flower app folder ``flwr run`` needs: a pyproject naming fedwear's apps."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(APP_PYPROJECT.format(version=__version__))
    return folder


def make_certs(folder: Path, hosts: list[str]) -> list[Path]:
    """A local certificate authority and a SuperLink certificate for ``hosts`` (testing only)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise FedwearError("openssl not found: install it (e.g. apt install openssl) or bring your own certificates")
    folder.mkdir(parents=True, exist_ok=True)
    san = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts)
    (folder / "server.ext").write_text(
        f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-sha256", "-days", "365", "-nodes", "-keyout", "ca.key",
         "-out", "ca.crt", "-subj", "/CN=fedwear test CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", "-newkey", "rsa:2048", "-sha256", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", f"/CN={hosts[0]}"],
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.crt", "-days", "365", "-sha256", "-extfile", "server.ext"],
    ]
    for step in steps:
        res = subprocess.run([openssl, *step], cwd=folder, capture_output=True, text=True)
        if res.returncode != 0:
            raise FedwearError(f"openssl {step[0]} failed: {res.stderr.strip().splitlines()[-1]}")
    return [folder / "ca.crt", folder / "server.crt", folder / "server.key"]


def superlink_command(certs: Path | None, host: str, port: int) -> list[str]:
    cmd = [_tool("flower-superlink"), "--host", host, "--port", str(port), "--disable-runtime-dependency-installation"]
    if certs is None:
        return [*cmd, "--insecure"]
    files = [certs / "ca.crt", certs / "server.crt", certs / "server.key"]
    for f in files:
        if not f.is_file():
            raise FedwearError(f"{f} not found: make certificates with `fedwear flower certs {certs}`")
    return [*cmd, "--ssl-ca-certfile", str(files[0]), "--ssl-certfile", str(files[1]), "--ssl-keyfile", str(files[2])]


def supernode_command(config: Path, superlink: str, ca: Path | None, port: int, data_root: Path | None,
                      client: str | None, role: str) -> list[str]:
    if not config.is_file():
        raise FedwearError(f"{config}: config file not found")
    if role not in ("train", "new"):
        raise FedwearError(f"--role {role!r}: use train or new")
    node = [f"config='{config.resolve()}'", f"role='{role}'"]
    if data_root is not None:
        if not data_root.is_dir():
            raise FedwearError(f"--data-root {data_root}: folder not found")
        node.append(f"data-root='{data_root.resolve()}'")
    if client:
        node.append(f"client='{client}'")
    cmd = [_tool("flower-supernode"), "--superlink", superlink, "--node-config", " ".join(node), "--port", str(port)]
    return [*cmd, "--insecure"] if ca is None else [*cmd, "--root-certificates", str(ca.resolve())]


def serve_command(config: Path, out: Path, nodes: int, superlink: str, ca: Path | None,
                  home: Path) -> tuple[list[str], dict[str, str]]:
    """``flwr run`` of fedwear's app against ``superlink``, with a connection in its own FLWR_HOME."""
    if not config.is_file():
        raise FedwearError(f"{config}: config file not found")
    app = write_app(home / "app")
    conn = f'[superlink]\ndefault = "fedwear"\n\n[superlink.fedwear]\naddress = "{superlink}"\n'
    conn += "insecure = true\n" if ca is None else f'root-certificates = "{ca.resolve()}"\n'
    env = flower_env(home / "flwr")
    (home / "flwr" / "config.toml").write_text(conn)
    run_config = f"config='{config.resolve()}' out='{out.resolve()}' nodes={nodes}"
    return [_tool("flwr"), "run", str(app), "fedwear", "--run-config", run_config, "--stream"], env


def run_foreground(cmd: list[str], env: dict[str, str]) -> int:
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130


def default_home(tag: str) -> Path:
    return Path(tempfile.gettempdir()) / f"fedwear-flower-{os.getuid()}-{tag}"
