"""``fedwear data download/verify`` against a local HTTP server, and the bundled UCI HAPT subset.

The server runs on 127.0.0.1 in a thread and serves zips built here from a few real files of the
shared data (users 1 and 2 of UCI HAPT); nothing is fetched from the internet.
"""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import gzip
import importlib
import io
import logging
import os
import re
import shutil
import socket
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import platformdirs
import pytest
from typer.testing import CliRunner

from fedwear.cli import app
from fedwear.config import load_config
from fedwear.data import download as dl
from fedwear.data import load_federated, load_raw, uci_hapt
from fedwear.data.config import DatasetConfig
from fedwear.errors import ConfigError, DataError

# ``fedwear.data.preprocess`` the attribute is the function of that name, hence the module lookup
preprocess = importlib.import_module("fedwear.data.preprocess")

BUNDLED_USERS = [1, 4, 7, 10, 13, 16, 19, 22, 25, 28]
SUBSET_EXPS = {1: (1, 2), 2: (3, 4)}  # user -> experiments served by the test server

# The UCI HAPT entry with no archive hash and the layout of the served subset: the files are
# still checked against the pinned per-file manifest.
SUBSET = dataclasses.replace(
    dl.REGISTRY["uci_hapt"],
    archive_sha256=None,
    archive_bytes=None,
    layout=(
        dl.Expect("RawData/acc_exp??_user??.txt", 4, "acc files"),
        dl.Expect("RawData/gyro_exp??_user??.txt", 4, "gyro files"),
        dl.Expect("RawData/labels.txt", 1, "labels.txt"),
        dl.Expect("activity_labels.txt", 1, "activity_labels.txt"),
    ),
)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hapt_files(data_root: Path) -> dict[str, bytes]:
    """Original (decompressed) bytes of users 1 and 2 of UCI HAPT plus the two label files."""
    src = data_root / "uci_hapt"
    out = {}
    for user, exps in SUBSET_EXPS.items():
        for exp in exps:
            for kind in ("acc", "gyro"):
                rel = f"RawData/{kind}_exp{exp:02d}_user{user:02d}.txt"
                out[rel] = gzip.decompress((src / f"{rel}.gz").read_bytes())
    for rel in ("RawData/labels.txt", "activity_labels.txt"):
        out[rel] = (src / rel).read_bytes()
    return out


def make_zip(files: dict[str, bytes], prefix: str = "HAPT Data Set/", inner: bool = False) -> bytes:
    """A zip of ``files`` under ``prefix``; with ``inner``, that zip wrapped in another zip."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for rel, data in files.items():
            zf.writestr(prefix + rel, data)
    if not inner:
        return buf.getvalue()
    return make_zip({"HAPT Data Set.zip": buf.getvalue()}, prefix="")


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``(base URL, folder it serves)`` of an HTTP server on 127.0.0.1."""
    folder = tmp_path_factory.mktemp("served")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", folder
    httpd.shutdown()
    httpd.server_close()


def serve(server: tuple[str, Path], name: str, data: bytes) -> str:
    base, folder = server
    (folder / name).write_bytes(data)
    return f"{base}/{name}"


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hapt.zip"


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# ----------------------------------------------------------------------------- download


@pytest.mark.parametrize("inner", [False, True], ids=["nested-folder", "zip-in-zip"])
def test_download_then_load(server, hapt_files, tmp_path: Path, inner: bool) -> None:
    url = serve(server, f"ok-{inner}.zip", make_zip(hapt_files, inner=inner))
    target = tmp_path / "data" / "hapt"
    done = dl.download(SUBSET, target, url, quiet=True)
    assert done.fresh and done.root == target and done.report.ok
    assert done.report.hashed == len(hapt_files)
    assert [p.name for p in target.parent.iterdir()] == ["hapt"]  # no partial folder left
    raw = load_raw(DatasetConfig(name="uci_hapt", root=str(target)))
    assert [(r.subject, r.session) for r in raw.recordings] == [
        ("1", "exp01"), ("1", "exp02"), ("2", "exp03"), ("2", "exp04"),
    ]  # fmt: skip
    assert all(r.signal.shape[1] == 6 for r in raw.recordings)
    again = dl.download(SUBSET, target, url, quiet=True)  # a verified copy is kept as it is
    assert not again.fresh and again.report.ok


def test_download_cli_prints_root(server, hapt_files, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(dl.REGISTRY, "uci_hapt", SUBSET)
    url = serve(server, "cli.zip", make_zip(hapt_files))
    target = tmp_path / "hapt"
    res = CliRunner().invoke(app, ["data", "download", "uci_hapt", "--root", str(target), "--url", url, "--quiet"])
    assert res.exit_code == 0, res.output
    assert f"--set dataset.root={target}" in res.stdout
    assert "10 files match the pinned SHA-256" in res.stdout
    res = CliRunner().invoke(app, ["data", "verify", "uci_hapt", "--root", str(target)])
    assert res.exit_code == 0 and res.stdout.startswith("uci_hapt: OK: 4 acc files, 4 gyro files")


def test_tampered_archive_names_the_file(server, hapt_files, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(dl.REGISTRY, "uci_hapt", SUBSET)
    files = dict(hapt_files)
    rel = "RawData/acc_exp02_user01.txt"
    data = bytearray(files[rel])
    data[100] = ord("7") if data[100] != ord("7") else ord("8")  # one digit of one sample
    files[rel] = bytes(data)
    url = serve(server, "tampered.zip", make_zip(files))
    target = tmp_path / "data" / "hapt"
    res = CliRunner().invoke(app, ["data", "download", "uci_hapt", "--root", str(target), "--url", url, "--quiet"])
    assert res.exit_code == 2
    line = one_error_line(res.stderr)
    assert rel in line and "SHA-256 differs" in line and url in line
    assert not target.exists() and not (tmp_path / "data").exists()  # the folder it made is gone too


def test_archive_hash_is_checked(server, hapt_files, tmp_path: Path) -> None:
    """The real entry pins the UCI archive: any other archive is refused before unpacking."""
    url = serve(server, "other.zip", make_zip(hapt_files))
    target = tmp_path / "hapt"
    with pytest.raises(DataError, match=re.escape(url) + ": archive SHA-256 .* differs from the pinned 4ac4ae06"):
        dl.download(dl.REGISTRY["uci_hapt"], target, url, quiet=True)
    assert list(tmp_path.iterdir()) == []


def test_server_down_one_line(tmp_path: Path) -> None:
    url = closed_port_url()
    target = tmp_path / "hapt"
    res = CliRunner().invoke(app, ["data", "download", "uci_hapt", "--root", str(target), "--url", url])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    line = one_error_line(res.stderr)
    assert f"cannot download {url}" in line and "RawData/" in line and dl.REGISTRY["uci_hapt"].url in line
    assert list(tmp_path.iterdir()) == []


def test_failed_download_leaves_no_empty_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, the default root (<user data dir>/fedwear/NAME) is not left behind as empty folders."""
    data_home = tmp_path / "home" / ".local" / "share"
    monkeypatch.setattr(platformdirs, "user_data_dir", lambda app: str(data_home / app))
    (tmp_path / "home").mkdir()
    res = CliRunner().invoke(app, ["data", "download", "uci_hapt", "--url", closed_port_url()])
    assert res.exit_code == 2 and "cannot download" in res.stderr
    assert list((tmp_path / "home").iterdir()) == []


def make_tar(files: dict[str, bytes], mode: str = "w:gz", prefix: str = "HAPT Data Set/") -> bytes:
    """A tar archive (gzip-compressed with the default ``mode``) of ``files`` under ``prefix``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for rel, data in files.items():
            info = tarfile.TarInfo(prefix + rel)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_tar_archives_are_unpacked(server, hapt_files, tmp_path: Path, mode: str) -> None:
    url = serve(server, f"hapt.{mode}.tar", make_tar(hapt_files, mode))
    done = dl.download(SUBSET, tmp_path / "hapt", url, quiet=True)
    assert done.fresh and done.report.ok


NOISE = np.random.default_rng(0).bytes(50_000)  # does not compress: no bomb, just a damaged archive


@pytest.mark.parametrize("data, said", [
    (make_tar({"a.txt": NOISE})[:20_000], "is not a readable tar.gz archive"),  # cut short
    (make_zip({"a.txt": NOISE})[:-30], "is not a readable zip archive"),
    (b"<!DOCTYPE html><html>Not found</html>", "is neither a zip nor a tar archive"),
], ids=["truncated-tar.gz", "truncated-zip", "html"])
def test_an_unreadable_archive_is_named_for_what_it_is(server, tmp_path: Path, data: bytes, said: str) -> None:
    """A damaged tar.gz used to be called 'not a readable zip archive'."""
    url = serve(server, "broken", data)
    with pytest.raises(DataError, match=re.escape(f"{url} {said}")):
        dl.download(SUBSET, tmp_path / "hapt", url, quiet=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("pack", [
    lambda files: make_zip_deflated(files),
    lambda files: make_tar(files),
    lambda files: make_zip({"inner.zip": make_zip_deflated(files)}, prefix=""),
], ids=["zip", "tar.gz", "zip-in-zip"])
def test_a_zip_bomb_is_refused_before_it_is_written(server, tmp_path: Path, monkeypatch, pack) -> None:
    """8 MB of zeros packs into a few KB: over MAX_RATIO times the download, so it is refused,
    and no member file is written past the cap."""
    url = serve(server, "bomb", pack({"RawData/labels.txt": bytes(8 << 20)}))
    written = []  # the files unpacking writes (shutil.copyfileobj is how zipfile and tarfile write them)
    real = shutil.copyfileobj
    monkeypatch.setattr(shutil, "copyfileobj", lambda a, b, *k: written.append(getattr(b, "name", "")) or real(a, b, *k))
    with pytest.raises(DataError, match=r"unpacks to more than [\d,]+ bytes, 100 times the [\d,]+ bytes downloaded: "
                                        "refused as a zip bomb"):
        dl.download(SUBSET, tmp_path / "hapt", url, quiet=True)
    assert list(tmp_path.iterdir()) == []
    assert not [name for name in written if str(name).endswith("labels.txt")]  # the inner zip at most


def make_zip_deflated(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, data in files.items():
            zf.writestr("HAPT Data Set/" + rel, data)
    return buf.getvalue()


class FullDisk(io.FileIO):
    def write(self, data: bytes) -> int:  # type: ignore[override]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("when", ["download", "unpack"])
def test_a_full_disk_is_named(hapt_files, tmp_path: Path, monkeypatch, when: str) -> None:
    """A full disk used to say 'cannot download' (while fetching) or 'not a readable zip
    archive' (while unpacking)."""
    monkeypatch.setitem(dl.REGISTRY, "uci_hapt", SUBSET)
    archive = tmp_path / "hapt.zip"  # a file:// URL: no server thread to complain on stderr when cut off
    archive.write_bytes(make_zip(hapt_files))
    url = archive.as_uri()
    target = tmp_path / "data" / "hapt"
    if when == "download":
        real_open = Path.open
        monkeypatch.setattr(Path, "open", lambda self, mode="r", *a, **k: FullDisk(str(self), "wb")
                            if self.name == "archive" and "w" in mode else real_open(self, mode, *a, **k))
    else:
        def extractall(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "data" / "x"))

        monkeypatch.setattr(zipfile.ZipFile, "extractall", extractall)
    res = CliRunner().invoke(app, ["data", "download", "uci_hapt", "--root", str(target), "--url", url, "--quiet"])
    assert res.exit_code == 2
    assert one_error_line(res.stderr) == (f"error: cannot write {target.parent}: No space left on device (errno 28): "
                                          "free some space or choose another --root (nothing was installed)")
    assert not target.parent.exists()  # made by the download, removed with it


def test_verify_reports_each_problem(hapt_files, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(dl.REGISTRY, "uci_hapt", SUBSET)
    root = tmp_path / "hapt"
    for rel, data in hapt_files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel.startswith("RawData/gyro"):
            (root / f"{rel}.gz").write_bytes(gzip.compress(data))  # X.gz is accepted too
        else:
            (root / rel).write_bytes(data)
    assert dl.verify(SUBSET, root).hashed == len(hapt_files)
    bad = root / "RawData/gyro_exp03_user02.txt.gz"
    bad.write_bytes(gzip.compress(hapt_files["RawData/gyro_exp03_user02.txt"] + b"0 0 0\n"))
    (root / "RawData/acc_exp04_user02.txt").unlink()
    res = CliRunner().invoke(app, ["data", "verify", "uci_hapt", "--root", str(root)])
    assert res.exit_code == 2
    lines = res.stderr.splitlines()
    assert any(str(bad) in ln and "SHA-256 differs" in ln for ln in lines), res.stderr
    assert any("RawData/acc_exp??_user??.txt: 3 files, expected 4" in ln for ln in lines), res.stderr


def test_manifest_covers_the_full_layout() -> None:
    for name, src in dl.REGISTRY.items():
        manifest = dl.read_manifest(name)
        for e in src.layout:  # every key is covered by exactly one layout entry, counts agree
            assert sum(fnmatch.fnmatchcase(k, e.pattern) for k in manifest) == e.count, e
        assert len(manifest) == sum(e.count for e in src.layout)
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in manifest.values())


# ----------------------------------------------------------------------------- bundled subset


def test_bundled_subset_without_root(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(preprocess, "_ANNOUNCED", set())
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(
        "method: fedavg\nrounds: 1\ndataset:\n  name: uci_hapt\n  cache_dir: null\n"
        "  classes: [0, 1, 2, 3, 4, 5]\n  window: 128\n  stride: 64\n"
    )
    cfg = load_config(cfg_path)
    assert cfg.dataset.root is None
    with caplog.at_level(logging.INFO, logger="fedwear"):  # INFO: the normal path warns of nothing
        fd = load_federated(cfg.dataset, cfg.seed)
        for _ in range(2):  # said once per process, not once per call
            assert preprocess.require_root(cfg.dataset) == preprocess.bundled_root("uci_hapt")
    lines = [r.getMessage() for r in caplog.records if r.name == "fedwear" and "bundled" in r.getMessage()]
    assert all(r.levelno < logging.WARNING for r in caplog.records if r.name == "fedwear")
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "bundled UCI HAPT subset (10 of 30 users, 9.3 MB)" in lines[0]
    assert "fedwear data download uci_hapt" in lines[0]
    assert [c.client_id for c in fd.clients] == [f"s{u:02d}" for u in BUNDLED_USERS]
    from fedwear.data import dataset_label  # what tables, reports and summary.json call it

    assert dataset_label(cfg.dataset) == "uci_hapt (bundled subset: 10 of 30 users)"
    assert dataset_label(cfg.dataset.model_copy(update={"root": str(tmp_path)})) == "uci_hapt"
    for c in fd.clients:  # the six basic activities, in train and test of every user
        assert set(np.unique(c.train.y)) == set(range(6)) == set(np.unique(c.test.y))


def test_bundled_files_are_the_originals(data_root: Path) -> None:
    root = preprocess.bundled_root("uci_hapt")
    assert root is not None
    shared = data_root / "uci_hapt"
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    users = "|".join(f"{u:02d}" for u in BUNDLED_USERS)
    want = sorted(
        p.relative_to(shared).as_posix()
        for p in (shared / "RawData").iterdir()
        if re.fullmatch(rf"(acc|gyro)_exp\d\d_user({users})\.txt\.gz", p.name)
    )
    assert files == sorted([*want, "RawData/labels.txt", "activity_labels.txt", "NOTICE"])
    for rel in files:
        if rel != "NOTICE":
            assert (root / rel).read_bytes() == (shared / rel).read_bytes(), rel
    assert sum((root / rel).stat().st_size for rel in files) <= 10_000_000
    notice = (root / "NOTICE").read_text()
    assert ", ".join(map(str, BUNDLED_USERS[:-1])) in notice and "CC BY 4.0" in notice
    assert f"{len(BUNDLED_USERS)} of 30 users" == uci_hapt.BUNDLED
    labels = np.loadtxt(root / "RawData/labels.txt", dtype=np.int64)
    for u in BUNDLED_USERS:
        assert set(labels[labels[:, 1] == u, 2]) >= {1, 2, 3, 4, 5, 6}


def test_bundled_files_match_the_manifest() -> None:
    root = preprocess.bundled_root("uci_hapt")
    assert root is not None
    counts = dataclasses.replace(
        SUBSET,
        layout=tuple(
            dataclasses.replace(e, count=21 if e.count == 4 else 1) for e in SUBSET.layout
        ),
    )
    report = dl.verify(counts, root)
    assert report.ok and report.hashed == 44, report.problems


def test_no_bundle_error_and_list() -> None:
    with pytest.raises(ConfigError, match="set dataset.root=.*fedwear data download usc_had"):
        load_raw(DatasetConfig(name="usc_had"))
    res = CliRunner().invoke(app, ["data", "list"])
    assert res.exit_code == 0
    rows = {ln.split()[0]: ln for ln in res.stdout.splitlines()}
    assert "bundled: 10 of 30 users" in rows["uci_hapt"] and "not bundled" in rows["usc_had"]


def test_a_skip_for_missing_real_data_names_the_dataset_and_how_to_get_it(tmp_path: Path) -> None:
    from tests.conftest import real_data_missing

    text = real_data_missing(tmp_path, ["usc_had"])
    assert f"usc_had/ missing in {tmp_path}" in text
    assert f"`fedwear data download usc_had --root {tmp_path / 'usc_had'}`" in text and "FEDWEAR_DATA" in text
