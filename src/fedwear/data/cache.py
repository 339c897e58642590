"""Disk cache of finished :class:`FederatedData` objects.

The key is a sha256 over the dataset name, the raw files (relative path, size, mtime), the full
dataset config, the seed and :data:`CACHE_VERSION`; any change to these rebuilds. A merged
dataset (``dataset.sources``) has no files of its own: its sources' files count instead. The keys in
:data:`ADDED_KEYS` (added later) count only when set away from their default, so entries built
before they existed stay valid: their defaults produce what those entries hold. Entries are
pickles written atomically (temporary file + ``os.replace``); an unreadable entry is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path

import platformdirs

from fedwear.data import merged
from fedwear.data.config import DatasetConfig
from fedwear.data.types import FederatedData

CACHE_VERSION = 1  # bump whenever the processing changes what a config produces

#: Dataset keys added after version 1 whose defaults reproduce version 1's processing: left out
#: of the key while at their default (recording metadata, FedAli's split and normalisation,
#: merged datasets). ``drop_classes`` widened from a count to a count or a range: a count is
#: keyed as before.
ADDED_KEYS = ("client_by", "normalize_group", "normalize_from", "folds", "sources")


def _listing(files: list[Path], root: Path | None) -> list[list[object]]:
    """``[relative path, size, mtime_ns]`` per file, sorted."""
    out = []
    for p in sorted(files):
        st = p.stat()
        rel = str(p.relative_to(root)) if root is not None and p.is_relative_to(root) else str(p)
        out.append([rel, st.st_size, st.st_mtime_ns])
    return out


def cache_key(cfg: DatasetConfig, seed: int, files: list[Path], root: Path | None) -> str:
    """Hex sha256 identifying the processed result of ``cfg`` on ``files`` with ``seed``."""
    tree = cfg.model_dump(mode="json")
    for k in ADDED_KEYS:  # left out at their default (a key may already be: QUIET_DEFAULTS)
        if k in tree and tree[k] == DatasetConfig.model_fields[k].get_default(call_default_factory=True):
            del tree[k]
    payload: dict[str, object] = {
        "version": CACHE_VERSION,
        "name": cfg.name,
        "files": _listing(files, root),
        "config": tree,
        "seed": seed,
    }
    if cfg.sources:
        payload["sources"] = [
            [tag, _listing(found, src_root)] for tag, src_root, found in merged.source_files(cfg)
        ]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def cache_dir(setting: str | None) -> Path | None:
    """The cache folder for ``dataset.cache_dir``: ``"user"`` is the user's cache directory
    (``platformdirs.user_cache_dir("fedwear")``, so runs never write into the working tree)."""
    if setting is None:
        return None
    if setting == "user":
        return Path(platformdirs.user_cache_dir("fedwear")) / "processed"
    return Path(setting).expanduser()


def cache_path(cfg: DatasetConfig, key: str) -> Path | None:
    """Where the entry for ``key`` lives, or None when caching is disabled."""
    folder = cache_dir(cfg.cache_dir)
    return None if folder is None else folder / f"{cfg.name}-{key[:24]}.pkl"


def load(path: Path | None) -> FederatedData | None:
    """The cached object, or None if absent or unreadable (a corrupt entry is just rebuilt)."""
    if path is None or not path.is_file():
        return None
    try:
        with path.open("rb") as fh:
            obj = pickle.load(fh)
    except Exception:  # truncated / corrupt / from an incompatible version
        return None
    return obj if isinstance(obj, FederatedData) else None


def save(path: Path | None, data: FederatedData) -> None:
    """Write ``data`` to ``path`` atomically; failures to write only skip caching."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(data, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
