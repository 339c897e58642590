"""``fedwear flower ...``: certificates, the app folder, and starting the deployment processes.

Thin wrappers around Flower's own commands (``flower-superlink``, ``flower-supernode``,
``flwr run``); fedwear never grows its own networking.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
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
serverapp = "fedwear.flower_app:server_app"
clientapp = "fedwear.flower_app:client_app"

[tool.flwr.app.config]
config = ""
out = "runs/flower"
nodes = 1
overwrite = false
"""

QUIET_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


AUTH_DOCS = "https://flower.ai/docs/framework/how-to-authenticate-supernodes.html"
GRACE_SECONDS = 15.0  # how long a Flower process may take to stop after a forwarded signal
FORWARDED_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n))
REGISTER_TIMEOUT = 120.0  # seconds to wait for a starting SuperLink before registering SuperNodes


def flower_env(flwr_home: Path) -> dict[str, str]:
    """The environment of a Flower process: quiet, Flower's tools on PATH (flower-superexec must be
    there), its own FLWR_HOME."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    return {**os.environ, **QUIET_ENV, "PATH": path, "FLWR_HOME": str(flwr_home)}


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
    if (openssl := shutil.which("openssl")) is None:
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


def make_node_keys(folder: Path, names: list[str]) -> list[Path]:
    """One SuperNode key pair per name: ``NAME.key`` (private, mode 600) and ``NAME.pub``.

    Flower's SuperNode authentication takes NIST-curve EC keys in OpenSSH format (the
    ``ssh-keygen -t ecdsa -b 384`` of Flower's guide, see ``AUTH_DOCS``). An existing key pair
    is kept, never overwritten: its public key may already be registered.
    """
    for name in names:
        if not name or Path(name).name != name:
            raise FedwearError(f"node name {name!r}: use a plain file name such as node1")
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for name in names:
        private, public = folder / f"{name}.key", folder / f"{name}.pub"
        if not private.exists():
            _write_key_pair(private, public, comment=name)
        elif not public.exists():
            raise FedwearError(f"{private} exists without {public}: remove it or restore its public key")
        files += [private, public]
    return files


def _write_key_pair(private: Path, public: Path, comment: str) -> None:
    """A new P-384 key pair in OpenSSH format; the private key readable by its owner only."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    public.write_bytes(line + f" {comment}\n".encode())


def check_private_key(path: Path) -> Path:
    """``path`` if it holds an EC private key in OpenSSH format, as ``flower-supernode`` needs."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if not path.is_file():
        raise FedwearError(f"--node-key {path}: file not found (make one with `fedwear flower node-keys`)")
    try:
        key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise FedwearError(f"--node-key {path}: not an unencrypted OpenSSH private key ({e})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise FedwearError(f"--node-key {path}: Flower needs an EC (ecdsa) key, not {type(key).__name__}")
    return path


def node_public_keys(paths: list[Path]) -> list[Path]:
    """The public keys to register: each path is a ``.pub`` file or a folder of them, each key a
    NIST-curve EC public key in OpenSSH format, as ``flwr supernode register`` accepts."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    keys: list[Path] = []
    for p in paths:
        if p.is_dir():
            if not (found := sorted(p.glob("*.pub"))):
                raise FedwearError(f"--node-keys {p}: no *.pub files in this folder")
            keys += found
        elif p.is_file():
            keys.append(p)
        else:
            raise FedwearError(f"--node-keys {p}: no such file or folder")
    for k in keys:
        try:
            key = serialization.load_ssh_public_key(k.read_bytes())
        except (ValueError, TypeError) as e:
            raise FedwearError(f"{k}: not an OpenSSH public key ({e})") from None
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise FedwearError(f"{k}: Flower needs an EC (ecdsa) public key, not {type(key).__name__}")
    return keys


def superlink_command(certs: Path | None, host: str, port: int, node_auth: bool = False) -> list[str]:
    """``flower-superlink`` on ``host:port``: TLS with the certificates in ``certs`` (or
    ``--insecure``), and with ``node_auth`` its ``--enable-supernode-auth`` (only registered
    SuperNodes may connect; Flower allows it with TLS only). See ``flower-superlink --help``.
    """
    cmd = [_tool("flower-superlink"), "--host", host, "--port", str(port), "--disable-runtime-dependency-installation"]
    if certs is None:
        if node_auth:
            raise FedwearError("SuperNode authentication needs TLS: give --certs DIR instead of --insecure")
        return [*cmd, "--insecure"]
    files = superlink_cert_files(certs)
    cmd += ["--ssl-ca-certfile", str(files[0]), "--ssl-certfile", str(files[1]), "--ssl-keyfile", str(files[2])]
    return [*cmd, "--enable-supernode-auth"] if node_auth else cmd


def superlink_cert_files(certs: Path) -> list[Path]:
    """``ca.crt``, ``server.crt`` and ``server.key`` of ``certs``, which must all exist."""
    files = [certs / "ca.crt", certs / "server.crt", certs / "server.key"]
    for f in files:
        if not f.is_file():
            raise FedwearError(f"{f} not found: make certificates with `fedwear flower certs {certs}`")
    return files


def supernode_command(config: Path, superlink: str, ca: Path | None, port: int, data_root: Path | None,
                      client: str | None, role: str, node_key: Path | None = None) -> list[str]:
    """``flower-supernode`` playing one client; with ``node_key`` it signs its requests with that
    private key (``--auth-supernode-private-key``), which a SuperLink with SuperNode
    authentication requires to be registered. See ``flower-supernode --help``.
    """
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
    if node_key is not None:
        if ca is None:
            raise FedwearError("--node-key needs TLS: give --root-certificates CA.crt instead of --insecure")
        cmd += ["--auth-supernode-private-key", str(check_private_key(node_key).resolve())]
    return [*cmd, "--insecure"] if ca is None else [*cmd, "--root-certificates", str(ca.resolve())]


def connection_env(home: Path, superlink: str, ca: Path | None) -> dict[str, str]:
    """A Flower environment whose FLWR_HOME names one SuperLink connection, ``fedwear``, for the
    ``flwr`` CLI (``[superlink.fedwear]`` in ``config.toml``)."""
    conn = f'[superlink]\ndefault = "fedwear"\n\n[superlink.fedwear]\naddress = "{superlink}"\n'
    conn += "insecure = true\n" if ca is None else f'root-certificates = "{ca.resolve()}"\n'
    env = flower_env(home / "flwr")
    (home / "flwr" / "config.toml").write_text(conn)
    return env


def serve_command(config: Path, out: Path, nodes: int, superlink: str, ca: Path | None,
                  home: Path, overwrite: bool = False) -> tuple[list[str], dict[str, str]]:
    """``flwr run`` of fedwear's app against ``superlink``, with a connection in its own FLWR_HOME."""
    if not config.is_file():
        raise FedwearError(f"{config}: config file not found")
    app = write_app(home / "app")
    env = connection_env(home, superlink, ca)
    run_config = (f"config='{config.resolve()}' out='{out.resolve()}' nodes={nodes} "
                  f"overwrite={str(overwrite).lower()}")
    return [_tool("flwr"), "run", str(app), "fedwear", "--run-config", run_config, "--stream"], env


def register_nodes(keys: list[Path], host: str, port: int, ca: Path, home: Path,
                   link: subprocess.Popen) -> list[tuple[Path, int]]:
    """Register each public key with the SuperLink ``link`` once it listens on ``host:port``.

    Runs ``flwr supernode register KEY fedwear --format json`` (Flower's CLI-managed SuperNode
    authentication, see ``AUTH_DOCS``) and returns ``(key, node id)`` pairs. The SuperLink keeps
    registrations in its state, in memory by default: they are made again at every start.
    """
    h = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)  # where this machine reaches it
    address = f"[{h}]:{port}" if ":" in h else f"{h}:{port}"
    wait_for_port(address, link)
    env = connection_env(home, address, ca)
    return [(k, _register(k, env)) for k in keys]


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` names this machine (a loopback IP or ``localhost``)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def wait_for_port(address: str, proc: subprocess.Popen, timeout: float = REGISTER_TIMEOUT) -> None:
    """Return once ``address`` accepts TCP connections; fail if ``proc`` exits or time runs out."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FedwearError(f"the SuperLink exited (status {proc.returncode}) before it was ready")
        with suppress(OSError), socket.create_connection((host.strip("[]"), int(port)), timeout=1):
            return
        time.sleep(0.3)
    raise FedwearError(f"the SuperLink did not listen on {address} within {timeout:.0f} s")


def _register(key: Path, env: dict[str, str]) -> int:
    """``flwr supernode register`` of one public key; its node id. ``flwr`` exits with 0 even
    when registration fails, so its JSON reply tells."""
    cmd = [_tool("flwr"), "supernode", "register", str(key.resolve()), "fedwear", "--format", "json"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    try:
        reply = json.loads(res.stdout[res.stdout.find("{"):])
    except ValueError:
        reply = {}
    if not reply.get("success"):
        why = reply.get("error-message") or res.stderr or f"flwr exited with status {res.returncode}"
        lines = [line for line in why.splitlines() if line.strip()] or [why]
        raise FedwearError(f"registering {key} failed: {lines[-1]}")
    return int(reply["node-id"])


def run_child(cmd: list[str], env: dict[str, str],
              after_start: Callable[[subprocess.Popen], None] | None = None,
              grace: float = GRACE_SECONDS) -> tuple[int, bool]:
    """Run a Flower process as this process's child until it exits; return its exit status and
    whether a signal asked it to stop.

    SIGTERM, SIGINT and SIGHUP sent to this process are passed on to the child (SIGHUP as
    SIGTERM, which Flower's processes handle by shutting down cleanly); a child still running
    ``grace`` seconds after the first of them is killed. The child runs in its own process group,
    so a Ctrl-C in the terminal reaches it once, through this process; on Linux it is killed if
    this process dies first. ``after_start(child)`` runs once the child is started (e.g. to
    register SuperNodes); if it fails, the child is stopped and the error raised.
    """
    if os.name != "posix":
        child = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    else:
        child = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, process_group=0,
                                 preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    with forward_signals(child) as stopping:
        if after_start is not None:
            try:
                after_start(child)
            except BaseException:
                if not stopping:  # not already asked to stop by a signal: SIGTERM, then a kill after grace
                    with suppress(ProcessLookupError):
                        child.terminate()
                    wait_child(child, [time.monotonic()], grace)
                    raise
        return wait_child(child, stopping, grace), bool(stopping)


def _die_with_parent() -> None:
    """In the child before exec: ask Linux for SIGKILL when the parent dies (``PR_SET_PDEATHSIG``),
    so that not even a SIGKILL of fedwear, which cannot be forwarded, leaves the child running."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


@contextmanager
def forward_signals(child: subprocess.Popen) -> Iterator[list[float]]:
    """While open, SIGTERM/SIGINT/SIGHUP go to ``child``; yields the (monotonic) times they came.

    Signals this process ignores (e.g. SIGHUP under ``nohup``) stay ignored.
    """
    stopping: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(time.monotonic())
        with suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM if signum == getattr(signal, "SIGHUP", None) else signum)

    previous = {}
    for sig in FORWARDED_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, forward)
    try:
        yield stopping
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_child(child: subprocess.Popen, stopping: list[float], grace: float) -> int:
    """Wait for ``child``; kill it ``grace`` seconds after the first forwarded signal. Its exit
    status as a shell reports it: 128 + N for a child ended by signal N."""
    while True:
        try:
            code = child.wait(timeout=0.2)
            return 128 - code if code < 0 else code
        except subprocess.TimeoutExpired:
            if stopping and time.monotonic() - stopping[0] > grace:
                child.kill()


def default_home(tag: str) -> Path:
    """A FLWR_HOME of its own for each fedwear-started Flower process (under the temp folder)."""
    return Path(tempfile.gettempdir()) / f"fedwear-flower-{os.getuid()}-{tag}"
