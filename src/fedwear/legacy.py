"""Run folders of older fedwear versions, whose checkpoints were pickles: their conversion.

fedwear never unpickles a run folder on its own. :func:`convert_run` is for a user who asks for
it (``fedwear upgrade --trust-pickles``) and reads the old ``checkpoint.pkl`` and
``client_states/*.pkl`` with an unpickler that builds only what those files hold: numpy arrays,
dtypes and scalars, :class:`fedwear.methods.api.Record`, and the builtin containers pickle
writes without naming a class. Any other class or function in a file stops the conversion
before it is called, so a crafted pickle does not run code even then.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

from fedwear.callbacks import CHECKPOINT, LEGACY_CHECKPOINT, save_checkpoint
from fedwear.engines import recordio
from fedwear.engines.store import FOLDER, state_file
from fedwear.errors import FedwearError
from fedwear.methods.api import Record

#: (module, name) of every global an old checkpoint or state file may name: numpy's array,
#: dtype and scalar reconstruction (under numpy 2's ``numpy._core`` and numpy 1's
#: ``numpy.core``) and fedwear's Record.
ALLOWED = frozenset({
    ("fedwear.methods.api", "Record"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    *((core, name) for core in ("numpy._core.multiarray", "numpy.core.multiarray") for name in ("_reconstruct", "scalar")),
    *((core, "_frombuffer") for core in ("numpy._core.numeric", "numpy.core.numeric")),
})


class _Unpickler(pickle.Unpickler):
    """Resolves only :data:`ALLOWED`; anything else is refused before it can be called."""

    def __init__(self, data: bytes, path: Path) -> None:
        super().__init__(io.BytesIO(data))
        self.path = path

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in ALLOWED:
            raise FedwearError(f"{self.path}: names {module}.{name}, which no fedwear checkpoint holds: "
                               "not converted (the file may have been crafted to run code; delete the run folder "
                               "or rerun it with --overwrite)")
        return super().find_class(module, name)


def load_legacy(path: Path) -> object:
    """The object pickled in ``path``, built from :data:`ALLOWED` globals only."""
    try:
        return _Unpickler(path.read_bytes(), path).load()
    except FedwearError:
        raise
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, LookupError, AttributeError) as e:
        raise FedwearError(f"{path}: not a readable pickle of an older fedwear ({type(e).__name__}): not converted; "
                           "rerun the run with --overwrite") from None


def convert_run(run_dir: Path) -> list[Path]:
    """Convert ``run_dir``'s pickled checkpoint (``checkpoint.pkl`` and the disk store's
    ``client_states/*.pkl``) to today's files (``checkpoint.npz``, ``client_states/*.npz``), with
    the same content (the config hash too); then remove the pickles. Returns the files written
    (none when there is no ``checkpoint.pkl``; stray state pickles, which no checkpoint can
    reference then, are removed).

    The new files are in place before any pickle goes, so an interrupted conversion can be run
    again. One-line FedwearError, with nothing removed, for a pickle holding anything but
    arrays and records (see :data:`ALLOWED`), or for one that is not a checkpoint."""
    old, states = run_dir / LEGACY_CHECKPOINT, run_dir / FOLDER
    old_states = sorted(states.glob("*.pkl")) + sorted(states.glob("*.pkl.tmp"))
    written: list[Path] = []
    if old.exists():
        ckpt = load_legacy(old)
        clients = ckpt.get("clients", {}) if isinstance(ckpt, dict) else None
        if not isinstance(ckpt, dict) or not isinstance(ckpt.get("config_hash"), str) \
                or not isinstance(ckpt.get("server"), Record) or not isinstance(clients, dict):
            raise FedwearError(f"{old}: not a fedwear checkpoint: not converted; rerun the run with --overwrite")
        if clients and all(isinstance(v, str) for v in clients.values()):  # the disk store's index
            ckpt = {**ckpt, "clients": {cid: _convert_state(states, cid, name, written) for cid, name in clients.items()}}
        try:
            save_checkpoint(run_dir / CHECKPOINT, ckpt)
        except (TypeError, ValueError, AttributeError) as e:  # an object array, a malformed Record
            (run_dir / CHECKPOINT).with_suffix(".tmp").unlink(missing_ok=True)
            raise FedwearError(f"{old}: cannot be converted ({e}); rerun the run with --overwrite") from None
        written.insert(0, run_dir / CHECKPOINT)
        old.unlink()
    for path in old_states:
        path.unlink(missing_ok=True)
    return written


def _convert_state(states: Path, cid: str, name: str, written: list[Path]) -> str:
    """Client ``cid``'s old state file ``name`` written anew (appended to ``written``); its new name."""
    path = states / name
    if path.name != name or not name.endswith(".pkl"):
        raise FedwearError(f"{states}: the checkpoint names {name!r}, not a client state file: not converted")
    state = load_legacy(path)
    if not isinstance(state, Record):
        raise FedwearError(f"{path}: not a client state: not converted; rerun the run with --overwrite")
    try:
        data = recordio.dumps(state)
    except (TypeError, ValueError, AttributeError) as e:
        raise FedwearError(f"{path}: cannot be converted ({e}); rerun the run with --overwrite") from None
    new = states / state_file(cid, data)
    new.write_bytes(data)
    written.append(new)
    return new.name
