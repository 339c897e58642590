"""Checkpoints and client-state files are NPZ + JSON: nothing in a run folder is unpickled, what
is saved comes back exactly, and an older version's pickles convert only through a loader that
builds arrays and records and nothing else."""

from __future__ import annotations

import os
import pickle
import shlex
from pathlib import Path

import numpy as np
import pytest

import fedwear
from fedwear.callbacks import CHECKPOINT, load_checkpoint, save_checkpoint
from fedwear.engines import recordio
from fedwear.engines.store import FOLDER, DiskStore, saved_states
from fedwear.errors import FedwearError
from fedwear.methods.api import Record
from tests.helpers import tiny_config
from tests.test_run import Interrupt
from tests.test_store import same_record


class Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def one_line_error(e: pytest.ExceptionInfo, *names: object) -> str:
    msg = str(e.value)
    assert "\n" not in msg and all(str(n) in msg for n in names), msg
    return msg


def same_checkpoint(a: dict, b: dict) -> bool:
    """Equal keys in the same order, records bit for bit, the rest equal with the same types."""
    if list(a) != list(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, Record):
            ok = isinstance(y, Record) and same_record(x, y)
        elif k == "clients":
            ok = list(x) == list(y) and all(
                same_record(x[c], y[c]) if isinstance(x[c], Record) else x[c] == y[c] for c in x)
        else:
            ok = repr(x) == repr(y)
        if not ok:
            return False
    return True


def interrupted(tmp_path: Path, **sets) -> tuple:
    """A 4-round run stopped after round 2 (checkpoint at round 2), and its config."""
    cfg = tiny_config(rounds=4, **{"optimizer.persist": True, **sets})
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, out, callbacks=[Interrupt(after=2)])
    return cfg, out


def rich_record(seed: float) -> Record:
    return Record({"body.w": np.linspace(-1, 1, 96, dtype=np.float32).reshape(8, 12) * seed,
                   "f64": np.array([np.pi, -0.0, np.inf, np.nan]),
                   "i64": np.array([-1, 2**62], np.int64), "mask": np.array([True, False, True]),
                   "opt.step": np.array(7.0, np.float32), "epoch": np.array(3, np.int64),
                   "fortran": np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
                   "fortran.big": np.asfortranarray(np.arange(120, dtype=">f4").reshape(10, 12)),
                   "a/b%2F.c": np.arange(80, dtype=np.int64).reshape(40, 2), "empty": np.zeros((0, 2), np.int8)},
                  {"loss": np.float32(0.1) * np.float32(seed), "lr": 0.05, "n": 12, "flag": True,
                   "phase": "soft", "nan": float("nan"), "big": 2**70, "k": np.int64(2), "on": np.bool_(False)})


def test_records_and_checkpoints_come_back_exactly(tmp_path):
    clients = {"ü/sub.1": rich_record(1.0), "s.02": rich_record(2.0), "%2F": Record(), "meta.json": rich_record(3.0)}
    ckpt = {"config_hash": "abc123", "round": 7, "server": rich_record(0.5), "clients": clients,
            "callbacks": {"EarlyStopping": {"best": -np.inf, "bad": 2}, "$odd": {"$np": (1, [2.5, None])}},
            "versions": {"torch": "2.5.1", "flwr": None}}
    save_checkpoint(tmp_path / CHECKPOINT, ckpt)
    back = load_checkpoint(tmp_path / CHECKPOINT)
    assert same_checkpoint(ckpt, back) and list(back["clients"]) == list(clients)
    assert type(back["server"].scalars["loss"]) is np.float32 and type(back["server"].scalars["lr"]) is float
    assert type(back["server"].scalars["flag"]) is bool and type(back["server"].scalars["on"]) is np.bool_
    arrays = back["server"].arrays
    assert arrays["opt.step"].shape == () and all(arrays[k].flags.f_contiguous for k in ("fortran", "fortran.big"))
    assert all(a.flags.writeable for a in arrays.values())
    assert back["callbacks"]["$odd"] == {"$np": (1, [2.5, None])} and back["callbacks"]["EarlyStopping"]["best"] == -np.inf
    assert not (tmp_path / "checkpoint.tmp").exists()
    first = (tmp_path / CHECKPOINT).read_bytes()
    save_checkpoint(tmp_path / CHECKPOINT, back)
    assert (tmp_path / CHECKPOINT).read_bytes() == first  # the bytes depend on the content only
    with np.load(tmp_path / CHECKPOINT, allow_pickle=False) as z:  # named by place, readable by numpy
        assert {"server/body.w", "clients/ü%2Fsub.1/a%2Fb%252F.c", "clients/meta%2Ejson/fortran.big"} <= set(z.files)
        assert "server/opt.step" not in z.files  # small arrays are in meta.json
    store = DiskStore(tmp_path / FOLDER)
    for cid, rec in clients.items():
        store[cid] = rec
    again = DiskStore(tmp_path / FOLDER, store.checkpoint())
    assert all(same_record(again[c], r) for c, r in clients.items())
    assert all(name.endswith(".npz") and "/" not in name for name in store.checkpoint().values())


def test_a_crafted_checkpoint_is_never_executed(tmp_path):
    cfg, out = interrupted(tmp_path)
    marker = tmp_path / "pwned"
    (out / CHECKPOINT).write_bytes(pickle.dumps({"config_hash": Payload(marker)}))
    with pytest.raises(FedwearError) as e:
        load_checkpoint(out / CHECKPOINT)
    assert "pickled data" in one_line_error(e, out / CHECKPOINT, "--overwrite")
    with pytest.raises(FedwearError) as e:
        fedwear.run(cfg, out, resume=True)
    one_line_error(e, CHECKPOINT)
    np.savez(out / CHECKPOINT, **{"meta.json": np.array([Payload(marker)], dtype=object)})  # a pickle inside
    with pytest.raises(FedwearError) as e:
        load_checkpoint(out / CHECKPOINT)
    one_line_error(e, out / CHECKPOINT, "--overwrite")
    (out / CHECKPOINT).write_bytes(b"PK\x03\x04 torn")
    with pytest.raises(FedwearError) as e:
        load_checkpoint(out / CHECKPOINT)
    one_line_error(e, out / CHECKPOINT, "--overwrite")
    assert not marker.exists()


def test_crafted_client_state_files_are_never_executed(tmp_path):
    cfg, out = interrupted(tmp_path, client_states="disk", method="local")
    marker = tmp_path / "pwned"
    index = load_checkpoint(out / CHECKPOINT)["clients"]
    for name in index.values():
        (out / FOLDER / name).write_bytes(pickle.dumps(Record({"x": np.zeros(1)}, {"p": Payload(marker)})))
    cid = next(iter(index))
    with pytest.raises(FedwearError) as e:
        DiskStore(out / FOLDER, index)[cid]
    one_line_error(e, out / FOLDER / index[cid], "--overwrite")
    with pytest.raises(FedwearError) as e:
        saved_states(index, out)[cid]  # as `fedwear report --embeddings` reads them
    one_line_error(e, index[cid])
    with pytest.raises(FedwearError) as e:
        fedwear.run(cfg, out, resume=True)
    one_line_error(e, FOLDER, "--overwrite")
    assert not marker.exists()


def test_a_checkpoint_index_names_only_files_in_client_states(tmp_path):
    cfg, out = interrupted(tmp_path, client_states="disk", method="local")
    (tmp_path / "keep.npz").write_bytes(b"not the run's")
    ckpt = load_checkpoint(out / CHECKPOINT)
    cid = next(iter(ckpt["clients"]))
    save_checkpoint(out / CHECKPOINT, {**ckpt, "clients": {**ckpt["clients"], cid: "../../keep.npz"}})
    with pytest.raises(FedwearError) as e:
        fedwear.run(cfg, out, resume=True)
    one_line_error(e, "../../keep.npz", "--overwrite")
    with pytest.raises(FedwearError):
        saved_states(load_checkpoint(out / CHECKPOINT)["clients"], out)
    assert (tmp_path / "keep.npz").read_bytes() == b"not the run's"


def test_what_cannot_come_back_exactly_is_not_written(tmp_path):
    for bad in (Record({"o": np.array([object()])}), Record({}, {"s": {1, 2}}), {"k": {1: 2}}):
        with pytest.raises((TypeError, ValueError)):
            recordio.dumps(bad)


def test_a_compressed_archive_is_refused_before_it_inflates(tmp_path):
    """A zip bomb: 64 MB of zeros deflated to ~64 KB, named as a checkpoint. fedwear writes its
    archives stored, so a compressed member is refused from its header, never inflated."""
    import io
    import zipfile

    path = tmp_path / CHECKPOINT
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": (8 * 2**20,)})
        zf.writestr("model.npy", buf.getvalue() + bytes(64 * 2**20))
    assert path.stat().st_size < 2**20
    with pytest.raises(FedwearError, match=r"is compressed \(67108\d+ bytes from \d+\): fedwear writes its archives "
                                           r"stored and never inflates one"):
        recordio.read(path, "checkpoint")


def test_a_checkpoint_that_is_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / CHECKPOINT)
    with pytest.raises(FedwearError, match=rf"{tmp_path / CHECKPOINT}: not a readable checkpoint \(not a regular file\)"):
        recordio.read(tmp_path / CHECKPOINT, "checkpoint")


def test_a_stored_member_declaring_more_than_it_holds_is_refused_before_any_allocation(tmp_path):
    """A .npy header may declare any shape; numpy allocates it before reading. A 10**12-element
    declaration in a few bytes was a MemoryError traceback (or terabytes asked of the OS)."""
    import io
    import resource
    import zipfile

    path = tmp_path / CHECKPOINT
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
        zf.writestr("model.npy", buf.getvalue() + bytes(64))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(FedwearError, match=r"member 'model.npy' declares 8000000000000 bytes of data in a \d+-byte "
                                           r"member\); rerun with --overwrite"):
        recordio.read(path, "checkpoint")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB: nothing was allocated


@pytest.mark.parametrize("change", ["shape", "dtype"])
def test_a_checkpoint_whose_arrays_the_model_cannot_take_is_one_line_on_resume(tmp_path, change):
    """Wrong shapes were a torch RuntimeError traceback; int64 arrays resumed silently."""
    cfg = tiny_config(rounds=4)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, out, callbacks=[Interrupt(after=2)])
    ckpt = load_checkpoint(out / CHECKPOINT)
    key = next(iter(ckpt["server"].arrays))
    a = ckpt["server"].arrays[key]
    ckpt["server"].arrays[key] = np.zeros(a.size + 1, a.dtype) if change == "shape" else a.astype(np.int64)
    save_checkpoint(out / CHECKPOINT, ckpt)
    with pytest.raises(FedwearError) as e:
        fedwear.run(cfg, out, resume=True)
    text = one_line_error(e, out / CHECKPOINT, f"the server's array {key!r} is", "rerun with --overwrite")
    assert ("int64" in text) if change == "dtype" else (f"[{a.size + 1}]" in text)


def test_a_server_state_that_grows_still_resumes(tmp_path):
    """FedPCL's prototype set grows after round 1: only the model's own arrays are held to the
    config's shapes on resume (the server's others were once refused)."""
    cfg = tiny_config(method="fedpcl", rounds=3)
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, tmp_path, callbacks=[Interrupt(after=2)])
    assert fedwear.run(cfg, tmp_path, resume=True).summary["final_round"] == 3
