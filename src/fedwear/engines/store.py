"""Where the in-process engines keep client states between rounds (``client_states``).

``memory``: a dict, as always; a checkpoint holds every state. ``disk``: one file per
state *version* in ``<run dir>/client_states/``, named ``<client>.<digest of its bytes>.npz``
(an NPZ archive of :mod:`fedwear.engines.recordio`, read without unpickling anything),
so a file is never rewritten with other bytes and a checkpoint only stores the index
{client id: file name} (writing a checkpoint costs nothing per client; the states that changed
were written as they changed). RAM holds only the states an engine is working on (a round's
clients), not every client's: that is what lets one process hold thousands of clients.

File life cycle (disk): writing a client's new state supersedes its previous file, which is
deleted at once unless the last saved checkpoint references it; then it goes once the next
checkpoint is saved (:meth:`ClientStore.checkpoint_saved`). Restoring a checkpoint reads the
files its index names and deletes the others (states written after it by a run that was
killed), so a resumed run reads exactly the states an uninterrupted one would have.
"""

from __future__ import annotations

import hashlib
import os
import re
import weakref
from abc import abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import quote

from fedwear import files
from fedwear.engines import recordio
from fedwear.errors import FedwearError
from fedwear.methods.api import Record

#: The disk store's folder inside the run directory.
FOLDER = files.STATES


class ClientStore(Mapping[str, Record]):
    """Client id -> its state. ``in_memory``/``peak_in_memory`` count the states of this store
    held in RAM (by the store or by whoever read or wrote them), to check the memory bound."""

    peak_in_memory = 0

    @abstractmethod
    def __setitem__(self, cid: str, state: Record) -> None: ...

    @property
    @abstractmethod
    def in_memory(self) -> int: ...

    @abstractmethod
    def checkpoint(self) -> dict:
        """What a checkpoint stores under ``"clients"`` (given back to :meth:`restore`)."""

    def checkpoint_saved(self) -> None:
        """The checkpoint holding :meth:`checkpoint`'s answer is on disk: what only older
        checkpoints needed may go."""

    @abstractmethod
    def restore(self, saved: dict) -> None:
        """Continue from a checkpoint's ``"clients"``."""

    def close(self) -> None:
        """The run ends (or stops): what no saved checkpoint needs may go."""


class MemoryStore(ClientStore):
    """Every state in a dict; a checkpoint holds the states themselves (the format of old runs)."""

    def __init__(self) -> None:
        self.states: dict[str, Record] = {}

    def __getitem__(self, cid: str) -> Record:
        return self.states[cid]

    def __setitem__(self, cid: str, state: Record) -> None:
        self.states[cid] = state
        self.peak_in_memory = max(self.peak_in_memory, len(self.states))

    def __iter__(self) -> Iterator[str]:
        return iter(self.states)

    def __len__(self) -> int:
        return len(self.states)

    @property
    def in_memory(self) -> int:
        return len(self.states)

    def checkpoint(self) -> dict[str, Record]:
        return dict(self.states)

    def restore(self, saved: dict[str, Record]) -> None:
        self.states = dict(saved)
        self.peak_in_memory = max(self.peak_in_memory, len(self.states))


#: What :func:`state_file` names: the quoted client id, the digest, ``.npz``.
STATE_FILE = re.compile(r"[A-Za-z0-9_.~%-]+\.[0-9a-f]{20}\.npz")


def _index(folder: Path, files: Mapping[str, str]) -> dict[str, str]:
    """``files`` (a checkpoint's index), checked to name only state files inside ``folder``: a
    crafted index can neither read nor delete anything else."""
    for name in files.values():
        if not isinstance(name, str) or not STATE_FILE.fullmatch(name):
            raise FedwearError(f"{folder}: the checkpoint names {name!r}, not a client state file; "
                               "rerun with --overwrite")
    return dict(files)


def state_file(cid: str, data: bytes) -> str:
    """The file name of client ``cid``'s state whose file holds ``data``: the same bytes, the same
    name (``cid`` quoted, so that any id is one file name)."""
    return f"{quote(cid, safe='')}.{hashlib.blake2b(data, digest_size=10).hexdigest()}.npz"


class DiskStore(ClientStore):
    """One NPZ file per state version in ``folder``; RAM holds none of them (reads on access)."""

    def __init__(self, folder: Path, files: dict[str, str] | None = None) -> None:
        self.folder = folder
        self._own_folder()
        self.files: dict[str, str] = _index(folder, files or {})  # client id -> file of its current state
        self.kept = set(self.files.values())  # files the last saved checkpoint references
        self.superseded: list[str] = []  # replaced files that ``kept`` holds back until the next checkpoint
        self.alive: dict[int, weakref.ref] = {}  # states read or written that are still in RAM

    def __getitem__(self, cid: str) -> Record:
        path = self.folder / self.files[cid]
        state = recordio.read(path, "client state")
        if not isinstance(state, Record):
            raise FedwearError(f"{path}: not a client state of this fedwear version; rerun with --overwrite")
        self._track(state)
        return state

    def __setitem__(self, cid: str, state: Record) -> None:
        data = recordio.dumps(state)
        name = state_file(cid, data)
        path = self.folder / name
        if not path.exists():  # same name, same bytes: a referenced file is never rewritten
            self._own_folder()
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(name + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        old = self.files.get(cid)
        self.files[cid] = name
        if old is not None and old != name:
            if old in self.kept:
                self.superseded.append(old)
            else:
                (self.folder / old).unlink()
        self._track(state)

    def __contains__(self, cid: object) -> bool:
        return cid in self.files

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    @property
    def in_memory(self) -> int:
        return len(self.alive)

    def _track(self, state: Record) -> None:
        key = id(state)
        if key not in self.alive:
            self.alive[key] = weakref.ref(state, lambda _, key=key: self.alive.pop(key, None))
            self.peak_in_memory = max(self.peak_in_memory, len(self.alive))

    def checkpoint(self) -> dict[str, str]:
        return dict(self.files)

    def checkpoint_saved(self) -> None:
        self.kept = set(self.files.values())
        for name in self.superseded:
            if name not in self.kept:
                (self.folder / name).unlink(missing_ok=True)
        self.superseded = []

    def restore(self, saved: dict[str, str]) -> None:
        self._own_folder()
        files = _index(self.folder, saved)
        missing = [n for n in files.values() if not (self.folder / n).is_file()]
        if missing:
            raise FedwearError(f"{self.folder}: {len(missing)} client state files of the checkpoint are missing "
                               f"(e.g. {missing[0]}); rerun with --overwrite")
        self.files, self.kept, self.superseded = files, set(files.values()), []
        self._remove_unkept()

    def close(self) -> None:
        self._remove_unkept()
        if self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()

    def _remove_unkept(self) -> None:
        """Delete every state file no saved checkpoint references (written after it, or
        superseded, or a write's leftover ``.tmp``); files fedwear did not name are left alone."""
        self._own_folder()
        if self.folder.is_dir():
            for path in self.folder.iterdir():
                ours = STATE_FILE.fullmatch(path.name.removesuffix(".tmp")) and not path.is_symlink()
                if ours and path.name not in self.kept:
                    path.unlink()

    def _own_folder(self) -> None:
        """Refuse a states folder that is a link: a shared run folder's ``client_states`` may point
        anywhere, and writing or deleting through it would reach outside the run folder."""
        if self.folder.is_symlink():
            raise FedwearError(f"{self.folder} is a symbolic link: fedwear does not write or delete through "
                               "links in a run folder; remove it")


def open_store(kind: str, out: Path | None) -> ClientStore:
    """The store ``client_states: kind`` asks for; ``out`` (the run directory) holds a disk store."""
    if kind == "memory":
        return MemoryStore()
    if out is None:
        raise FedwearError("client_states=disk needs a run directory to keep the states in")
    return DiskStore(out / FOLDER)


def saved_states(clients: dict, out: Path) -> Mapping[str, Record]:
    """A checkpoint's client states (its ``"clients"``), read on demand when they are files in
    ``out`` (a disk store's index: values are file names), else as saved."""
    if clients and all(isinstance(v, str) for v in clients.values()):
        return DiskStore(out / FOLDER, clients)
    return clients
