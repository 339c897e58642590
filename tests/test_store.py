"""Client-state stores (``client_states: memory | disk``): same numbers, small checkpoints that
write only what changed, exact resume, memory bounded by a round's clients."""

from __future__ import annotations

import numpy as np
import pytest

import fedwear
from fedwear.callbacks import CHECKPOINT, load_checkpoint
from fedwear.engines import recordio
from fedwear.engines.runner import Callback
from fedwear.engines.store import FOLDER, DiskStore, saved_states, state_file
from fedwear.errors import ConfigError, FedwearError
from fedwear.methods.api import Record
from tests.helpers import tiny_config
from tests.test_run import Interrupt


def same_record(a: Record, b: Record) -> bool:
    """Bit for bit: names, dtypes, shapes, bytes, and scalars with their Python types."""
    return (a.arrays.keys() == b.arrays.keys()
            and all(a.arrays[k].dtype == b.arrays[k].dtype and a.arrays[k].shape == b.arrays[k].shape
                    and a.arrays[k].tobytes() == b.arrays[k].tobytes() for k in a.arrays)
            and [(k, type(v), repr(v)) for k, v in a.scalars.items()]
            == [(k, type(v), repr(v)) for k, v in b.scalars.items()])


def state_files(out) -> set[str]:
    folder = out / FOLDER
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


class Files(Callback):
    """The state files present after each round."""

    def __init__(self, out) -> None:
        self.out, self.after = out, {0: set()}

    def on_round(self, runner, info):
        self.after[info.round] = state_files(self.out)


def test_disk_store_keeps_records_exactly_and_never_rewrites_a_checkpointed_file(tmp_path):
    store = DiskStore(tmp_path / FOLDER)
    rec = Record({"f16": np.arange(6, dtype=np.float16).reshape(2, 3), "i64": np.array([-1, 2**40]),
                  "b": np.array([True, False]), "zero_d": np.array(3.5, dtype=np.float64),
                  "fortran": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
                  "empty": np.zeros((0, 5), np.int8)},
                 {"i": 7, "f": 0.1, "nan": float("nan"), "flag": True, "s": "x/y"})
    store["a/b"] = rec
    back = store["a/b"]
    assert same_record(back, rec) and back.arrays["fortran"].flags.f_contiguous
    assert "a/b" in store and "c" not in store and list(store) == ["a/b"] and len(store) == 1
    assert store.get("c") is None
    first = store.checkpoint()["a/b"]
    assert "/" not in first
    store.checkpoint_saved()  # a checkpoint now references `first`
    store["a/b"] = Record({"x": np.ones(2)})
    second = store.checkpoint()["a/b"]
    assert {first, second} == state_files(tmp_path)
    store["a/b"] = Record({"x": np.zeros(2)})  # `second` was never checkpointed: goes at once
    third = store.checkpoint()["a/b"]
    assert state_files(tmp_path) == {first, third}
    store.checkpoint_saved()
    assert state_files(tmp_path) == {third}
    saved = store.checkpoint()
    store["a/b"], store["c"] = Record({"x": np.full(2, 5.0)}), rec  # then the run is killed
    (tmp_path / FOLDER / (state_file("c", b"half") + ".tmp")).write_bytes(b"half a file")  # a write cut short
    resumed = DiskStore(tmp_path / FOLDER)
    resumed.restore(saved)
    assert state_files(tmp_path) == {third} and list(resumed) == ["a/b"]
    assert same_record(resumed["a/b"], Record({"x": np.zeros(2)}))


@pytest.mark.parametrize(("method", "sets"), [("fedavg", {"optimizer.persist": True}), ("fedrep", {}),
                                             ("local", {}), ("fedavg", {"engine": "batched"})])
@pytest.mark.slow
def test_disk_and_memory_stores_give_identical_runs(tmp_path, method, sets):
    runs = {kind: fedwear.run(tiny_config(method=method, client_states=kind, **sets), tmp_path / kind)
            for kind in ("memory", "disk")}
    mem, disk = (r.out_dir for r in runs.values())
    for name in ("metrics.csv", "rounds.csv"):
        assert (mem / name).read_bytes() == (disk / name).read_bytes()
    a, b = load_checkpoint(mem / CHECKPOINT), load_checkpoint(disk / CHECKPOINT)
    assert same_record(a["server"], b["server"])
    assert all(isinstance(v, Record) for v in a["clients"].values())
    assert all(isinstance(v, str) for v in b["clients"].values())
    states = saved_states(b["clients"], disk)  # as `fedwear report --embeddings` reads them
    assert a["clients"].keys() == states.keys() and a["clients"]
    assert all(same_record(a["clients"][c], states[c]) for c in a["clients"])
    assert state_files(disk) == set(b["clients"].values())


def test_disk_checkpoint_holds_an_index_and_writes_only_changed_states(tmp_path):
    sets = {"optimizer.persist": True, "model.options.width": 32, "clients_per_round": 2}
    mem = fedwear.run(tiny_config(**sets), tmp_path / "memory").out_dir
    files = Files(tmp_path / "disk")
    disk = fedwear.run(tiny_config(client_states="disk", **sets), tmp_path / "disk", callbacks=[files]).out_dir
    ckpt = load_checkpoint(disk / CHECKPOINT)
    server = len(recordio.dumps(ckpt["server"]))
    client_bytes = sum(s.nbytes for s in load_checkpoint(mem / CHECKPOINT)["clients"].values())
    assert client_bytes > 100_000
    assert (mem / CHECKPOINT).stat().st_size > client_bytes
    assert (disk / CHECKPOINT).stat().st_size < server + 100 * len(ckpt["clients"]) + 1000
    for r in range(1, 4):  # each round adds a file for each of its 2 clients, nothing else
        assert len(files.after[r] - files.after[r - 1]) <= 2


def test_resume_after_kill_ignores_states_written_after_the_checkpoint(tmp_path, monkeypatch):
    cfg = tiny_config(rounds=5, checkpoint_every=2, client_states="disk", **{"optimizer.persist": True})
    full = fedwear.run(cfg, tmp_path / "full").out_dir
    cut = tmp_path / "cut"
    with monkeypatch.context() as m:
        m.setattr(DiskStore, "close", lambda self: None)  # a SIGKILL cleans nothing up
        with pytest.raises(KeyboardInterrupt):
            fedwear.run(cfg, cut, callbacks=[Interrupt(after=3)])
    index = load_checkpoint(cut / CHECKPOINT)["clients"]
    assert load_checkpoint(cut / CHECKPOINT)["round"] == 2
    assert state_files(cut) > set(index.values())  # round 3's states are there, newer than the checkpoint
    fedwear.run(cfg, cut, resume=True)
    for name in ("metrics.csv", "rounds.csv"):
        assert (cut / name).read_bytes() == (full / name).read_bytes()
    a, b = load_checkpoint(full / CHECKPOINT), load_checkpoint(cut / CHECKPOINT)
    assert same_record(a["server"], b["server"]) and a["clients"] == b["clients"]
    assert state_files(cut) == set(b["clients"].values())


def test_resume_refuses_a_checkpoint_whose_state_files_are_gone(tmp_path):
    cfg = tiny_config(rounds=4, checkpoint_every=2, client_states="disk")
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, tmp_path, callbacks=[Interrupt(after=3)])
    (tmp_path / FOLDER / next(iter(load_checkpoint(tmp_path / CHECKPOINT)["clients"].values()))).unlink()
    with pytest.raises(FedwearError, match="client state files of the checkpoint are missing.*--overwrite"):
        fedwear.run(cfg, tmp_path, resume=True)


def test_without_checkpoints_no_state_files_stay_and_overwrite_clears_them(tmp_path):
    fedwear.run(tiny_config(client_states="disk", checkpoint_every=0), tmp_path / "a")
    assert not (tmp_path / "a" / FOLDER).exists()
    fedwear.run(tiny_config(client_states="disk", method="local"), tmp_path / "b")
    assert state_files(tmp_path / "b")
    fedwear.run(tiny_config(method="local"), tmp_path / "b", overwrite=True)
    assert not (tmp_path / "b" / FOLDER).exists()


class Peak(Callback):
    def on_end(self, runner):
        self.store = runner.executor.states


@pytest.mark.parametrize("kind", ["memory", "disk"])
@pytest.mark.slow
def test_disk_store_holds_at_most_a_rounds_clients_in_memory(tmp_path, kind):
    cfg = tiny_config(rounds=4, clients_per_round=5, local_epochs=1, client_states=kind, checkpoint_every=2,
                      **{"optimizer.persist": True, "dataset.synthetic.num_subjects": 302,
                         "dataset.synthetic.seconds_per_class": 2, "dataset.split": "stratified",
                         "evaluation.every": 4,
                         "evaluation.views": "[personalized]", "evaluation.adapt_epochs": 0})
    peak = Peak()
    fedwear.run(cfg, tmp_path, callbacks=[peak])
    assert len(peak.store) > 5  # more clients than a round's have a state
    if kind == "disk":
        assert 1 <= peak.store.peak_in_memory <= 5 and peak.store.in_memory == 0
    else:
        assert peak.store.peak_in_memory == peak.store.in_memory == len(peak.store)


@pytest.mark.parametrize("engine", ["flower-sim", "flower"])
def test_disk_store_is_refused_on_the_flower_engines(engine):
    with pytest.raises(ConfigError) as e:
        tiny_config(engine=engine, client_states="disk")
    assert "client_states" in str(e.value) and "engine=sim" in str(e.value) and "\n" not in str(e.value)


def test_a_states_folder_that_is_a_link_is_refused_and_nothing_outside_is_deleted(tmp_path):
    """A shared run folder's client_states pointing at another folder, with a checkpoint that keeps
    no clients: --resume deleted every file there. Now nothing is read, written or deleted through it."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "thesis.tex").write_text("keep me\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / FOLDER).symlink_to(outside, target_is_directory=True)
    for act in (lambda: DiskStore(run / FOLDER), lambda: DiskStore(run / FOLDER, {}).restore({})):
        with pytest.raises(FedwearError, match="is a symbolic link: fedwear does not write or delete through links"):
            act()
    assert (outside / "thesis.tex").read_text() == "keep me\n"


def test_the_store_deletes_only_its_own_state_files(tmp_path):
    store = DiskStore(tmp_path / FOLDER)
    store["a"] = Record({"x": np.zeros(2)}, {})
    (tmp_path / FOLDER / "notes.txt").write_text("mine\n")
    store.restore({})  # a checkpoint that keeps no client: the state file goes, the user's file stays
    assert [p.name for p in (tmp_path / FOLDER).iterdir()] == ["notes.txt"]
