"""Get a real dataset onto disk and check it: ``fedwear data download`` and ``fedwear data verify``.

Each :class:`Source` names the official archive, the files the loader expects after unpacking
(:class:`Expect`) and what is pinned. Two kinds of SHA-256 values are pinned:

* **The archive.** UCI HAPT's static archive on the UCI ML Repository (dataset 341) is pinned to
  SHA-256 ``4ac4ae06...3deb09`` and 79,596,192 bytes. fedwear did not compute this value (the
  archive could not be fetched when it was recorded): it is the value pinned for that archive
  in public code of three apparently unrelated projects, one of which also pins this URL and that
  size. If UCI ever repacks the archive, the download stops with an error; the manual route
  (unpack by hand, then ``fedwear data verify``) still checks every file. No published checksum
  of USC-HAD.zip was found, so its archive hash is *unknown* (``None``) and its download is
  checked file by file only.
* **Every file the loader reads**, for the datasets of :data:`REGISTRY`, in
  ``fedwear/data/manifests/<name>.sha256`` (``sha256sum`` format, written by
  ``scripts/make_manifest.py`` with :func:`build_manifest`). The values were computed from a
  reference copy of each dataset whose provenance is in :attr:`Source.reference` and in the
  manifest header. For a file stored compressed as ``X.gz`` the hash is the one of the
  decompressed ``X``, so ``X`` and ``X.gz`` are both accepted.

The datasets of :data:`UNPINNED` (PAMAP2, UniMiB-SHAR, HARBox, HHAR, RealWorld, ExtraSensory,
WISDM) have neither: no published SHA-256 of their archives was found, and fedwear has no
reference copy to hash their files from, so none is invented. Their download checks the layout
(the expected files are there, in the expected numbers) and ``fedwear data download`` /
``verify`` then read every file with the loader; the archive's SHA-256 and size are printed and
recorded in ``<root>/fedwear-download.json`` (:data:`RECORD`) with ``"pinned": false``, so a
later download can be compared with it by hand.

A download streams the archive to a temporary folder next to the target, checks the archive hash
when one is pinned, unpacks it (also when the dataset folder sits one level down or inside a zip
inside the zip), verifies every file against the manifest and only then renames the folder into
place, so a failed download never leaves a half-written dataset behind.

Archives are zip files, a zip inside a zip, or tar archives (WISDM's ``.tar.gz``, extracted with
the ``data`` filter: no absolute paths, links or devices), told apart by their first bytes, so an
unreadable one is named for what it is ("not a readable tar.gz archive"). Unpacking is capped at
:data:`MAX_RATIO` times the bytes downloaded (:class:`Budget`): a zip bomb is refused before it
fills the disk. A full disk or a folder one may not write to is named as such, with its path.

Sources: UCI HAPT, J.-L. Reyes-Ortiz, L. Oneto, A. Samà, X. Parra, D. Anguita, Neurocomputing 171
(2016) 754-767, https://archive.ics.uci.edu/dataset/341 (CC BY 4.0); USC-HAD, M. Zhang and
A. A. Sawchuk, UbiComp SAGAware 2012, https://sipi.usc.edu/had/.
"""

from __future__ import annotations

import contextlib
import fnmatch
import gzip
import hashlib
import http.client
import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fedwear.errors import NO_ACCESS, NO_SPACE, DataError

CHUNK = 1 << 20  # bytes per read while downloading and hashing
TIMEOUT = 60.0  # seconds without data before a download is abandoned
#: The most an archive may unpack to, as a multiple of the bytes downloaded. Sensor recordings
#: (text, MAT files) compress 1-10x, a zip bomb 1,000x and more (deflate's limit is about 1,032x).
MAX_RATIO = 100


@dataclass(frozen=True)
class Expect:
    """``count`` files whose path under the dataset root, without a ``.gz`` suffix, matches the
    glob ``pattern`` (``fnmatch`` rules, case-sensitive). ``count`` None: the number is not known
    (not confirmed from the dataset's documentation); at least one file must match."""

    pattern: str
    count: int | None
    what: str


@dataclass(frozen=True)
class Source:
    """Where a dataset comes from and what a complete copy holds."""

    name: str
    title: str
    url: str
    layout: tuple[Expect, ...]
    marker: str  # a file (no .gz) whose folder is the dataset root inside the archive
    where: str  # the folder to place by hand, in words
    reference: str  # provenance of the copy the per-file manifest was computed from
    archive_sha256: str | None = None  # None: unknown, the download is verified file by file
    archive_bytes: int | None = None
    archive_pin: str = ""  # where the archive hash comes from, or why there is none
    pinned_files: bool = True  # a per-file manifest ships in manifests/<name>.sha256
    extra: tuple[str, ...] = ()  # further archives unpacked into the same folder (ExtraSensory)


REGISTRY: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            name="uci_hapt",
            title="UCI HAPT",
            url="https://archive.ics.uci.edu/static/public/341/"
            "smartphone+based+recognition+of+human+activities+and+postural+transitions.zip",
            layout=(
                Expect("RawData/acc_exp??_user??.txt", 61, "acc files"),
                Expect("RawData/gyro_exp??_user??.txt", 61, "gyro files"),
                Expect("RawData/labels.txt", 1, "labels.txt"),
                Expect("activity_labels.txt", 1, "activity_labels.txt"),
            ),
            marker="RawData/labels.txt",
            where="the folder that holds RawData/ (acc_expXX_userYY.txt, gyro_expXX_userYY.txt, "
            "labels.txt) and activity_labels.txt",
            reference="UCI HAPT v2.1 'HAPT Data Set/' folder as kept in the public repository "
            "buissonvalentin/Projet-python-for-datascience at commit c1c276e1a1c3 (RawData "
            "complete: 30 users, 61 experiments); not compared with the UCI archive itself",
            archive_sha256="4ac4ae064227c07045a99551876b54d204837e995e298b6488559e209b3deb09",
            archive_bytes=79_596_192,
            archive_pin="the value pinned for this static UCI archive in public code of three "
            "apparently unrelated projects; not computed by fedwear",
        ),
        Source(
            name="usc_had",
            title="USC-HAD",
            url="https://sipi.usc.edu/had/USC-HAD.zip",
            layout=(Expect("Subject*/a*t*.mat", 840, "trial files"),),
            marker="Subject1/a1t1.mat",
            where="the folder that holds Subject1/ .. Subject14/ (a{activity}t{trial}.mat files)",
            reference="USC-HAD as kept in the public repository cwi-dis/mobile-har-tutorial at "
            "commit 414b82e78dec (data/USC-HAD/); all 840 SHA-256 values equal those of the Git "
            "LFS pointers of ader003/PRCIS at commit b252714def31 (USC-HAD/)",
            archive_pin="no published SHA-256 of USC-HAD.zip was found",
        ),
    )
}


def _unpinned(**kw: Any) -> Source:
    """A source of :data:`UNPINNED`: no archive SHA-256, no reference copy, no per-file manifest."""
    pin = "no published SHA-256 of this archive was found: not pinned"
    return Source(reference="none", archive_pin=pin, pinned_files=False, **kw)


#: Datasets whose archives and files have no pinned SHA-256 (module docstring): the layout is
#: checked and the archive hash recorded at download. Counts marked None are not documented.
UNPINNED: dict[str, Source] = {
    s.name: s
    for s in (
        _unpinned(
            name="pamap2", title="PAMAP2",
            url="https://archive.ics.uci.edu/static/public/231/pamap2+physical+activity+monitoring.zip",
            layout=(Expect("Protocol/subject1??.dat", 9, "protocol files"),
                    Expect("Optional/subject1??.dat", None, "optional files")),
            marker="Protocol/subject101.dat",
            where="the PAMAP2_Dataset folder (Protocol/subject101.dat .. subject109.dat, Optional/)",
        ),
        _unpinned(
            name="unimib_shar", title="UniMiB-SHAR",
            url="https://www.dropbox.com/s/x2fpfqj0bpf8ep6/UniMiB-SHAR.zip?dl=1",
            layout=(Expect("data/acc_data.mat", 1, "acc_data.mat"),
                    Expect("data/acc_labels.mat", 1, "acc_labels.mat"),
                    Expect("data/acc_names.mat", 1, "acc_names.mat")),
            marker="data/acc_data.mat",
            where="the UniMiB-SHAR folder holding data/acc_data.mat, acc_labels.mat, acc_names.mat",
        ),
        _unpinned(
            name="harbox", title="HARBox",
            url="https://github.com/xmouyang/FL-Datasets-for-HAR/raw/main/datasets/HARBox/"
            "large_scale_HARBox.zip",
            layout=(Expect("*/*_train.txt", None, "class files"),),
            marker="*/Walk_train.txt",
            where="the large_scale_HARBox folder (one folder per user, {Class}_train.txt files)",
        ),
        _unpinned(
            name="hhar", title="HHAR",
            url="https://archive.ics.uci.edu/static/public/344/heterogeneity+activity+recognition.zip",
            layout=(Expect("Phones_accelerometer.csv", 1, "Phones_accelerometer.csv"),
                    Expect("Phones_gyroscope.csv", 1, "Phones_gyroscope.csv")),
            marker="Phones_accelerometer.csv",
            where="the 'Activity recognition exp' folder (Phones_accelerometer.csv, Phones_gyroscope.csv)",
        ),
        _unpinned(
            name="realworld", title="RealWorld 2016",
            url="http://wifo5-14.informatik.uni-mannheim.de/sensor/dataset/realworld2016/"
            "realworld2016_dataset.zip",
            layout=(Expect("proband*/data/acc_*_csv.zip", 120, "acc zips"),
                    Expect("proband*/data/gyr_*_csv.zip", 120, "gyr zips")),
            marker="proband1/data/acc_walking_csv.zip",
            where="the realworld2016_dataset folder (proband1 .. proband15)",
        ),
        _unpinned(
            name="extrasensory", title="ExtraSensory",
            url="http://extrasensory.ucsd.edu/data/primary_data_files/"
            "ExtraSensory.per_uuid_features_labels.zip",
            extra=("http://extrasensory.ucsd.edu/data/raw_measurements/"
                   "ExtraSensory.raw_measurements.raw_acc.zip",
                   "http://extrasensory.ucsd.edu/data/raw_measurements/"
                   "ExtraSensory.raw_measurements.proc_gyro.zip"),
            layout=(Expect("*.features_labels.csv", 60, "label files"),
                    Expect("raw_acc/*/*.m_raw_acc.dat", None, "raw acc files"),
                    Expect("proc_gyro/*/*.m_proc_gyro.dat", None, "gyro files")),
            marker="*.features_labels.csv",
            where="one folder holding the 60 {UUID}.features_labels.csv.gz, raw_acc/ and proc_gyro/",
        ),
        _unpinned(
            name="wisdm_ar", title="WISDM v1.1",
            url="https://www.cis.fordham.edu/wisdm/includes/datasets/latest/WISDM_ar_latest.tar.gz",
            layout=(Expect("WISDM_ar_v1.1_raw.txt", 1, "WISDM_ar_v1.1_raw.txt"),),
            marker="WISDM_ar_v1.1_raw.txt",
            where="the WISDM_ar_v1.1 folder (WISDM_ar_v1.1_raw.txt)",
        ),
    )
}  # fmt: skip


def all_sources() -> dict[str, Source]:
    """Every dataset ``fedwear data download`` knows: :data:`REGISTRY` (pinned), then
    :data:`UNPINNED`."""
    return {**REGISTRY, **UNPINNED}


#: The record of a download, written into the dataset folder.
RECORD = "fedwear-download.json"


def source(name: str) -> Source:
    """The entry of ``name`` in :func:`all_sources`; DataError listing the downloadable datasets
    otherwise."""
    known = all_sources()
    if name not in known:
        raise DataError(f"no download is known for dataset {name!r}; available: {', '.join(known)}")
    return known[name]


def default_root(name: str) -> Path:
    """``<user data dir>/fedwear/<name>`` (``platformdirs.user_data_dir``)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("fedwear")) / name


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of the file's content, of the decompressed content for ``*.gz``."""
    h = hashlib.sha256()
    with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def parse_manifest(text: str) -> dict[str, str]:
    """``path -> sha256`` from ``sha256sum`` lines (``HASH  path``); ``#`` lines are comments."""
    lines = [ln.strip() for ln in text.splitlines()]
    rows = [ln.split(None, 1) for ln in lines if ln and not ln.startswith("#")]
    return {rel.strip().removeprefix("*"): digest.lower() for digest, rel in rows}


def read_manifest(name: str) -> dict[str, str]:
    """The per-file manifest shipped in ``fedwear/data/manifests/<name>.sha256``."""
    res = resources.files("fedwear.data") / "manifests" / f"{name}.sha256"
    if not res.is_file():
        raise DataError(f"the pinned manifest {res} is missing from this install: reinstall fedwear")
    return parse_manifest(res.read_text(encoding="utf-8"))


def scan(root: Path) -> dict[str, list[Path]]:
    """Every file under ``root`` grouped by the name it stands for: its relative POSIX path,
    without ``.gz`` (``X`` and ``X.gz`` are one file)."""
    files: dict[str, list[Path]] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            files.setdefault(p.relative_to(root).as_posix().removesuffix(".gz"), []).append(p)
    return files


def _in_layout(src: Source, key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, e.pattern) for e in src.layout)


def build_manifest(src: Source, root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` that the layout of ``src`` covers (decompressed for
    ``.gz``), keyed by the name without ``.gz``; DataError if the layout is incomplete."""
    for e, n in count_layout(src, root):
        if n != e.count:
            raise DataError(f"{root}: {n} files match {e.pattern}, expected {e.count}")
    files = sorted(scan(root).items())
    return {k: file_sha256(paths[0]) for k, paths in files if _in_layout(src, k)}


def format_manifest(src: Source, hashes: dict[str, str]) -> str:
    """The text of ``manifests/<name>.sha256``: a commented header, then ``sha256sum`` lines."""
    head = [
        f"# SHA-256 of every {src.title} file that fedwear reads, by path under the dataset root.",
        "# For a file kept compressed as X.gz the hash is the one of X (the decompressed content).",
        f"# Reference copy: {src.reference}.",
        f"# Written by scripts/make_manifest.py; checked by 'fedwear data verify {src.name}'.",
    ]
    return "\n".join(head + [f"{h}  {k}" for k, h in sorted(hashes.items())]) + "\n"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a dataset folder: the file (relative path), what and the fix."""

    path: str
    issue: str
    fix: str


@dataclass
class Report:
    """Result of :func:`verify`: counts per :class:`Expect`, files hashed, problems."""

    counts: list[tuple[Expect, int]] = field(default_factory=list)
    hashed: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    pinned: bool = True

    def summary(self) -> str:
        """``61 acc files, 61 gyro files, ...; 124 files match the pinned SHA-256``."""
        parts = ", ".join(e.what if e.count == 1 else f"{n} {e.what}" for e, n in self.counts)
        if not self.pinned:
            return f"{parts}; no per-file SHA-256 is pinned for this dataset"
        return f"{parts}; {self.hashed} files match the pinned SHA-256"


MAX_LISTED = 10  # missing files named per layout entry; the rest are counted


def count_layout(src: Source, root: Path) -> list[tuple[Expect, int]]:
    """How many files under ``root`` match each layout entry (nothing is hashed)."""
    keys = list(scan(root))
    return [(e, sum(fnmatch.fnmatchcase(k, e.pattern) for k in keys)) for e in src.layout]


def verify(src: Source, root: Path, manifest: dict[str, str] | None = None) -> Report:
    """Check ``root`` against the layout of ``src`` and the per-file manifest.

    Counts come from ``src.layout``; every file the layout covers is hashed (its decompressed
    content for ``X.gz``) and compared with ``manifest`` (default: the shipped one). A file the
    layout covers but the manifest does not list is reported as not part of the dataset."""
    if manifest is None:
        manifest = read_manifest(src.name) if src.pinned_files else {}
    files = scan(root)
    report = Report(pinned=src.pinned_files)
    add = report.problems.append
    again = f"restore it from the original archive (fedwear data download {src.name})"
    for e in src.layout:
        found = [k for k in files if fnmatch.fnmatchcase(k, e.pattern)]
        report.counts.append((e, len(found)))
        if e.count is None:
            if not found:
                add(Problem(e.pattern, "no file matches", again))
            continue
        wrong = f"{len(found)} files, expected {e.count}"
        if len(found) > e.count:
            add(Problem(e.pattern, wrong, "remove the files that are not part of the dataset"))
        if len(found) >= e.count:
            continue
        missing = [
            k for k in sorted(manifest) if fnmatch.fnmatchcase(k, e.pattern) and k not in files
        ]
        for k in missing[:MAX_LISTED]:
            add(Problem(f"{k}[.gz]", "missing", again))
        if len(missing) > MAX_LISTED or not missing:
            add(Problem(e.pattern, wrong, again))
    if not src.pinned_files:
        return report
    outside = f"not part of {src.title} (not in the pinned manifest)"
    changed = "SHA-256 differs from the pinned value (corrupt or modified)"
    for key, paths in files.items():
        if not _in_layout(src, key) and key not in manifest:
            continue
        for p in paths:
            rel, want = p.relative_to(root).as_posix(), manifest.get(key)
            if want is None:
                add(Problem(rel, outside, "remove it"))
                continue
            try:
                got = file_sha256(p)
            except (OSError, EOFError, zlib.error) as exc:
                add(Problem(rel, f"unreadable ({type(exc).__name__})", again))
                continue
            if got == want:
                report.hashed += 1
            else:
                add(Problem(rel, changed, again))
    return report


@dataclass(frozen=True)
class Installed:
    """Where the dataset is, its verification report and whether it was just downloaded."""

    root: Path
    report: Report
    fresh: bool
    archive_sha256: str | None = None  # what was fetched (fresh downloads)
    archive_bytes: int | None = None


def by_hand(src: Source, target: Path) -> str:
    """The manual route (from the official URL), for error messages."""
    return (
        f"download {src.url} yourself, unpack it and move {src.where} to {target}, then run "
        f"'fedwear data verify {src.name} --root {target}'"
    )


def fetch(url: str, dest: Path, label: str, quiet: bool = False) -> tuple[str, int]:
    """Stream ``url`` into ``dest`` with a progress bar on stderr; returns (sha256, bytes).

    Network and HTTP failures raise :class:`OSError`-family or ``http.client`` errors; a failed
    write into ``dest`` (a full disk) raises :class:`NoRoom`, so it is not taken for the network."""
    from rich import progress as rp
    from rich.console import Console

    from fedwear.version import __version__

    req = urllib.request.Request(url, headers={"User-Agent": f"fedwear/{__version__}"})
    h, n = hashlib.sha256(), 0
    columns = (rp.TextColumn("{task.description}"), rp.BarColumn(), rp.DownloadColumn(),
               rp.TransferSpeedColumn(), rp.TimeRemainingColumn())  # fmt: skip
    with (
        urllib.request.urlopen(req, timeout=TIMEOUT) as resp,
        dest.open("wb", buffering=0) as out,  # unbuffered: a full disk fails in write, below
        rp.Progress(*columns, console=Console(stderr=True), disable=quiet) as bar,
    ):
        length = resp.headers.get("Content-Length")
        task = bar.add_task(label, total=int(length) if length and length.isdigit() else None)
        while chunk := resp.read(CHUNK):
            try:
                out.write(chunk)
            except OSError as exc:
                raise NoRoom(exc) from None
            h.update(chunk)
            n += len(chunk)
            bar.advance(task, len(chunk))
    return h.hexdigest(), n


class NoRoom(Exception):
    """Writing the download or its unpacked files failed for want of space or write access."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(f"{exc.strerror or exc} (errno {exc.errno})")


class Unreadable(Exception):
    """An archive that cannot be unpacked; the message says what it is, e.g. ``is not a readable
    tar.gz archive (...)``, to follow the URL or file name."""


@dataclass
class Budget:
    """What a download's archives may still unpack to, nested archives included: :data:`MAX_RATIO`
    times the bytes downloaded. A zip's members are checked by their declared sizes before one
    is written (``zipfile`` never inflates a member past its declared size), a tar's as each
    streams out, so a zip bomb is refused before it fills the disk."""

    left: int
    downloaded: int

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise Unreadable(
                f"unpacks to more than {self.downloaded * MAX_RATIO:,} bytes, {MAX_RATIO} times the "
                f"{self.downloaded:,} bytes downloaded: refused as a zip bomb (no dataset archive expands "
                "that much)"
            )


def archive_kind(path: Path) -> str:
    """What ``path`` holds, by its first bytes: ``zip``, ``tar``, ``tar.gz``, ``tar.bz2``,
    ``tar.xz``, or ``unknown`` (an HTML error page, say)."""
    with path.open("rb") as fh:
        head = fh.read(262)
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")) or zipfile.is_zipfile(path):
        return "zip"
    for magic, kind in ((b"\x1f\x8b", "tar.gz"), (b"BZh", "tar.bz2"), (b"\xfd7zXZ\x00", "tar.xz")):
        if head.startswith(magic):
            return kind
    return "tar" if head[257:262] == b"ustar" or tarfile.is_tarfile(path) else "unknown"


def unzip(archive: Path, dest: Path, budget: Budget) -> None:
    """Extract ``archive`` into ``dest``: a zip (``zipfile`` drops absolute and ``..`` member
    paths) or a tar archive, compressed or not (``tarfile``'s ``data`` filter refuses unsafe
    members), within ``budget``. Raises :class:`Unreadable` for an archive that is neither or is
    damaged, :class:`NoRoom` when the disk is full or ``dest`` not writable."""
    kind = archive_kind(archive)
    try:
        if kind == "zip":
            with zipfile.ZipFile(archive) as zf:
                budget.take(sum(info.file_size for info in zf.infolist()))
                zf.extractall(dest)
        elif kind.startswith("tar"):

            def admit(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
                budget.take(member.size)
                return tarfile.data_filter(member, path)

            with tarfile.open(archive) as tf:
                tf.extractall(dest, filter=admit)
        else:
            raise Unreadable("is neither a zip nor a tar archive (by its first bytes)")
    except OSError as exc:
        if exc.errno in NO_SPACE | NO_ACCESS:
            raise NoRoom(exc) from None
        raise Unreadable(f"is not a readable {kind} archive ({_reason(exc)})") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, tarfile.TarError, EOFError, zlib.error) as exc:
        raise Unreadable(f"is not a readable {kind} archive ({_reason(exc)})") from None


def holds(d: Path, marker: str) -> bool:
    """Whether folder ``d`` holds ``marker`` (or ``marker.gz``); the marker may be a glob."""
    return any(p.is_file() for m in (marker, f"{marker}.gz") for p in d.glob(m))


def locate(src: Source, folder: Path, budget: Budget, depth: int = 2) -> Path | None:
    """The shallowest folder under ``folder`` holding ``src.marker`` (or ``.gz``). When there is
    none, zips inside ``folder`` are unpacked next to themselves (within ``budget``) and
    searched, ``depth`` times."""
    dirs = sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts))
    for d in [folder, *dirs]:
        if holds(d, src.marker):
            return d
    inner = sorted(p for p in folder.rglob("*.zip") if p.is_file())
    if depth == 0 or not inner:
        return None
    for z in inner:
        try:
            unzip(z, z.with_name(f"{z.stem}.unzipped"), budget)
        except Unreadable as exc:
            raise Unreadable(f"holds {z.relative_to(folder)}, which {exc}") from None
        z.unlink()
    return locate(src, folder, budget, depth - 1)


def download(
    src: Source,
    root: Path | None = None,
    url: str | None = None,
    quiet: bool = False,
    manifest: dict[str, str] | None = None,
    extra_urls: tuple[str, ...] = (),
) -> Installed:
    """Download ``src`` into ``root`` (default :func:`default_root`) and verify it.

    ``url`` overrides ``src.url`` (mirrors, tests), ``extra_urls`` the further archives. A
    ``root`` that already holds a copy passing :func:`verify` is kept as it is (``fresh=False``).
    Every failure (network, HTTP, archive hash, unreadable archive, layout or per-file hash)
    raises a one-line DataError that names the URL or file and the manual route; nothing is left
    at ``root`` then."""
    url = url or src.url
    target = (root if root is not None else default_root(src.name)).expanduser().absolute()
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        if target.is_dir():
            report = verify(src, target, manifest)
            if report.ok:
                return Installed(target, report, fresh=False)
        raise DataError(
            f"{target} already exists and is not a complete {src.title} copy "
            f"(check it with 'fedwear data verify {src.name} --root {target}'): "
            "remove it or choose another --root"
        )
    # Folders this call creates, deepest first: a failed download removes them again when empty,
    # so an offline attempt leaves no empty <user data dir>/fedwear behind.
    created = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    except OSError as exc:
        raise DataError(
            f"cannot write to {target.parent} ({exc.strerror}): choose another --root"
        ) from exc
    no_room = (f"cannot write {target.parent}: {{}}: free some space or choose another --root "
               "(nothing was installed)")
    try:
        links = [url, *(extra_urls or src.extra)]
        parts = [staging / ("archive" if k == 0 else f"extra{k}") for k in range(len(links))]
        fetched = []
        for link, part in zip(links, parts, strict=True):
            try:
                fetched.append((link, *fetch(link, part, src.name, quiet)))
            except NoRoom as exc:
                raise DataError(no_room.format(exc)) from None
            except (OSError, http.client.HTTPException, ValueError) as exc:
                raise DataError(
                    f"cannot download {link} ({_reason(exc)}); {by_hand(src, target)}"
                ) from None
        _, digest, size = fetched[0]
        if src.archive_sha256 is not None and (
            digest != src.archive_sha256 or (src.archive_bytes not in (None, size))
        ):
            raise DataError(
                f"{url}: archive SHA-256 {digest[:16]}... ({size:,} bytes) differs from the pinned "
                f"{src.archive_sha256[:16]}... ({src.archive_bytes or 0:,} bytes), so it was not "
                f"unpacked; {by_hand(src, target)}"
            )
        unpacked = staging / "unpacked"
        total = sum(n for _, _, n in fetched)
        budget = Budget(MAX_RATIO * total, total)
        try:
            for link, part in zip(links, parts, strict=True):
                try:
                    unzip(part, unpacked, budget)
                except Unreadable as exc:
                    raise Unreadable(f"{link} {exc}") from None
                part.unlink()
            try:
                found = locate(src, unpacked, budget)
            except Unreadable as exc:
                raise Unreadable(f"{url} {exc}") from None
        except NoRoom as exc:
            raise DataError(no_room.format(exc)) from None
        except Unreadable as exc:
            raise DataError(f"{exc}; {by_hand(src, target)}") from None
        if found is None:
            raise DataError(f"{url}: no {src.marker} in the archive; {by_hand(src, target)}")
        report = verify(src, found, manifest)
        if not report.ok:
            first, n = report.problems[0], len(report.problems) - 1
            more = f" (and {n} more problems)" if n else ""
            raise DataError(
                f"{url}: {first.path}: {first.issue}{more}; nothing was installed: try again, "
                f"or {by_hand(src, target)}"
            )
        record = {
            "dataset": src.name,
            "archives": [{"url": u, "sha256": d, "bytes": n} for u, d, n in fetched],
            "pinned": src.archive_sha256 is not None,
        }
        (found / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if target.exists():
            target.rmdir()
        os.replace(found, target)
        created = []
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in created:
            with contextlib.suppress(OSError):  # not empty (another process wrote there): keep it
                folder.rmdir()
    return Installed(target, report, fresh=True, archive_sha256=digest, archive_bytes=size)


def _reason(exc: BaseException) -> str:
    """A short reason for a network or archive error."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__
