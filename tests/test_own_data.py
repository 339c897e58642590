"""The user's own recordings (``dataset.name: own``): docs/own-data.md runs as written, and the
schema's options (CSV, Parquet, NPZ; label column or per-file labels; timestamps; metadata from
file names), its errors, the cache and ``fedwear data verify own``."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedwear.cli import app
from fedwear.data import load_federated, load_raw
from fedwear.data.config import DatasetConfig
from fedwear.errors import ConfigError, DataError
from tests.test_docs import DOCS, run_doc

SCHEMA = """rate_hz: 20
channels: [ax, ay]
label_column: act
"""


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    return tmp_path


def table(n: int, labels: list[str], seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"ax": rng.normal(size=n), "ay": rng.normal(size=n),
                         "act": np.repeat(labels, n // len(labels))})  # fmt: skip


def own(root: Path, **kw: object) -> DatasetConfig:
    return DatasetConfig(name="own", root=str(root), cache_dir=None, **kw)


def test_guide_runs(sandbox: Path) -> None:
    """The guide's blocks print what it shows (run_doc compares each output exactly), and what
    they print is real results: every client has test windows and every view a finite accuracy."""
    ns = run_doc(DOCS / "own-data.md")
    assert ns["result"].summary["final_round"] == 3
    assert (sandbox / "my_study" / "dora.npz").is_file()
    data = ns["data"]
    assert len(data.clients) == 3 and len(data.new_clients) == 1
    assert all(len(c.test) > 0 for c in data.clients + data.new_clients)
    final = ns["result"].summary["final"]
    assert sorted(final) == ["generalization", "global", "new_clients", "personalized"]
    for view in final.values():
        assert all(isinstance(view[k], float) and 0.0 <= view[k] <= 1.0 for k in ("accuracy", "macro_f1"))
    assert round(final["personalized"]["accuracy"], 3) == 0.741  # the value the guide shows


def test_formats_read_alike(tmp_path: Path) -> None:
    """The same table as CSV, CSV.gz, Parquet and NPZ gives the same recordings."""
    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(SCHEMA)
    t = table(40, ["a", "b"])
    t.to_csv(root / "s1.csv", index=False)
    t.to_csv(root / "s2.csv.gz", index=False)
    t.to_parquet(root / "s3.parquet")
    np.savez(root / "s4.npz", ax=t["ax"].to_numpy(), ay=t["ay"].to_numpy(), act=t["act"].to_numpy(str))
    raw = load_raw(own(root))
    assert [r.subject for r in raw.recordings] == ["s1", "s2", "s3", "s4"] and raw.class_names == ["a", "b"]
    for r in raw.recordings:
        assert np.allclose(r.signal, t[["ax", "ay"]].to_numpy(), atol=1e-6)
        assert r.labels.tolist() == [0] * 20 + [1] * 20 and r.rate_hz == 20.0 and r.channels == ["ax", "ay"]


def test_file_labels_pattern_meta_and_timestamps(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(
        "rate_hz: 10\nchannels: [ax, ay]\nfile_labels: {p1_wrist_walk.csv: 2, p1_hip_walk.csv: 2, "
        "p2_wrist_sit.csv: 1}\nclasses: [0, 1, 2]\ntimestamp_column: t\n"
        "subject_pattern: '(?P<subject>p\\d+)_(?P<position>wrist|hip)_(?P<session>\\w+)'\n"
    )
    for name in ("p1_wrist_walk", "p1_hip_walk", "p2_wrist_sit"):
        t = table(30, ["x"]).drop(columns="act")
        t["t"] = np.concatenate([np.arange(15) / 10, 5 + np.arange(15) / 10])  # a 3.6 s gap
        t.to_csv(root / f"{name}.csv", index=False)
    raw = load_raw(own(root))
    assert [(r.subject, r.session, r.meta["position"]) for r in raw.recordings] == [
        ("p1", "walk#0", "hip"), ("p1", "walk#1", "hip"), ("p1", "walk#0", "wrist"),
        ("p1", "walk#1", "wrist"), ("p2", "sit#0", "wrist"), ("p2", "sit#1", "wrist"),
    ]  # fmt: skip
    assert raw.class_names == ["0", "1", "2"] and set(raw.recordings[0].labels) == {2}
    fd = load_federated(own(root, window=5, client_by=["subject", "position"]), 0)
    assert [c.client_id for c in fd.clients] == ["sp1-hip", "sp1-wrist", "sp2-wrist"]


def test_schema_and_file_errors_are_one_line(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    table(20, ["a"]).to_csv(root / "s1.csv", index=False)

    def error(kind: type[Exception]) -> str:
        with pytest.raises(kind) as err:
            load_raw(own(root))
        assert "\n" not in str(err.value)
        return str(err.value)

    assert "schema.yaml not found" in error(ConfigError)
    (root / "schema.yaml").write_text("rate_hz: 20\nchannels: [ax]\n")
    assert "exactly one of label_column" in error(ConfigError)
    (root / "schema.yaml").write_text(SCHEMA + "rate: 5\n")
    assert "key 'rate'" in error(ConfigError)
    (root / "schema.yaml").write_text(SCHEMA.replace("ay]", "az]"))
    assert "s1.csv: no column 'az'" in error(DataError)
    (root / "schema.yaml").write_text(SCHEMA + "classes: [b]\n")
    assert "row 1: label 'a' is not one of the classes b" in error(DataError)
    (root / "schema.yaml").write_text(SCHEMA)
    bad = table(20, ["a"])
    bad.loc[4, "ax"] = np.nan
    bad.to_csv(root / "s1.csv", index=False)
    assert "s1.csv: row 5, column 'ax': is empty: fill or interpolate it" in error(DataError)
    (root / "s1.csv").write_text("ax,ay,act\n1,oops,a\n")
    assert error(DataError).endswith("s1.csv: row 1, column 'ay': 'oops' is not a number: fix the cell, "
                                     "or check the schema's column names")  # fmt: skip
    (root / "s1.csv").write_text("ax,ay,act\n1,2,a\n1,2\n3\n")  # rows cut short
    assert "s1.csv: row 3, column 'ay': is empty" in error(DataError)


def test_cache_follows_the_schema_and_warnings(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(SCHEMA)
    for k in range(3):
        table(80, ["a", "b"], seed=k).to_csv(root / f"s{k}.csv", index=False)
    table(6, ["a"]).to_csv(root / "s9.csv", index=False)  # too short for one window
    cached = own(root, window=8, min_windows=1).model_copy(update={"cache_dir": str(tmp_path / "c")})
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        a = load_federated(cached, 0)
    msgs = [r.getMessage() for r in caplog.records if r.name == "fedwear"]
    assert any("subject s9 s9 (6 samples)" in m for m in msgs), msgs
    assert any("min_windows=1 train windows after the split and are left out: ss9" in m for m in msgs), msgs
    (root / "schema.yaml").write_text(SCHEMA.replace("rate_hz: 20", "rate_hz: 40"))
    b = load_federated(cached, 0)
    assert a.rate_hz == 20.0 and b.rate_hz == 40.0  # the schema is part of the cache key
    assert len(list((tmp_path / "c").glob("own-*.pkl"))) == 2


def test_verify_and_info_cli(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    schema = tmp_path / "elsewhere.yaml"
    schema.write_text(SCHEMA + "units: {ax: g}\n")
    table(20, ["a", "b"]).to_csv(root / "s1.csv", index=False)
    res = CliRunner().invoke(app, ["data", "verify", "own", "--root", str(root), "--schema", str(schema)])
    assert res.exit_code == 0, res.output
    assert "own: OK: read: 1 subjects, 1 recordings, 20 samples, 2 classes" in res.stdout
    res = CliRunner().invoke(app, ["data", "info", "own", "--root", str(root), "--schema", str(schema)])
    assert res.exit_code == 0 and '"ax": "g"' in res.stdout
    (root / "s1.csv").write_text("ax,ay,act\n1,two,a\n")
    res = CliRunner().invoke(app, ["data", "verify", "own", "--root", str(root), "--schema", str(schema)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "s1.csv" in res.stderr


def timed(root: Path, name: str, hz: float, n: int = 200) -> None:
    """A CSV of ``n`` samples whose timestamps run at ``hz``."""
    t = table(n, ["a", "b"])
    t["t"] = np.arange(n) / hz
    t.to_csv(root / name, index=False, float_format="%.6f")


@pytest.mark.parametrize("hz, measured", [(100.0, "100"), (25.0, "25")])
def test_timestamps_must_match_rate(tmp_path: Path, hz: float, measured: str) -> None:
    """100 Hz timestamps under rate_hz 50 are not read as 50 Hz, and a 25 Hz file is not cut into
    one recording per sample (each interval longer than the default gap of two periods)."""
    root = tmp_path / "d"
    (root / "s01").mkdir(parents=True)
    (root / "schema.yaml").write_text(SCHEMA.replace("rate_hz: 20", "rate_hz: 50")
                                      + "timestamp_column: t\nfiles: ['*/*.csv']\n")  # fmt: skip
    timed(root, "s01/walk.csv", hz)
    with pytest.raises(DataError) as err:
        load_raw(own(root))
    assert str(err.value) == (
        f"{root}/s01/walk.csv: timestamps are {measured} Hz but rate_hz is 50 in {root}/schema.yaml: set "
        "rate_hz there to the files' rate (or fix the timestamps: seconds, one row per sample)"
    )


def test_timestamps_near_rate_and_gaps_are_read(tmp_path: Path) -> None:
    """Within 5% of rate_hz (a device's drift) is accepted; a gap still starts a recording."""
    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(SCHEMA + "timestamp_column: t\n")
    timed(root, "s1.csv", 20.6)
    t = table(40, ["a"])
    t["t"] = np.concatenate([np.arange(20) / 20, 10 + np.arange(20) / 20])
    t.to_csv(root / "s2.csv", index=False)
    raw = load_raw(own(root))
    assert [(r.subject, r.session, len(r.labels)) for r in raw.recordings] == [
        ("s1", "s1", 200), ("s2", "s2#0", 20), ("s2", "s2#1", 20)
    ]


@pytest.mark.parametrize("cell, column, problem", [
    ("", "t", "is empty"),
    ("inf", "t", "is infinite"),
    ("NaN", "ax", "is NaN"),
    ("-inf", "ay", "is infinite"),
    ("0,5", "ax", "'0,5' is not a number"),
    ("1e39", "ay", "1e+39 is beyond float32's range (±3.4e+38), the precision signals are read in"),
])  # fmt: skip
def test_bad_cells_named_by_verify(tmp_path: Path, cell: str, column: str, problem: str) -> None:
    """``fedwear data verify own`` stops at a bad channel or timestamp cell with one line naming
    the file, row and column and what is wrong (not "corrupt; re-download it"), so nothing fails
    later in the run (1e39 overflows float32)."""
    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(SCHEMA + "timestamp_column: t\n")
    timed(root, "s1.csv", 20.0, n=20)
    t = pd.read_csv(root / "s1.csv", dtype=str)
    t.loc[6, column] = cell
    t.to_csv(root / "s1.csv", index=False)
    res = CliRunner().invoke(app, ["data", "verify", "own", "--root", str(root)])
    assert res.exit_code == 2
    assert res.stderr == f"error: {root}/s1.csv: row 7, column '{column}': {problem}: " + (
        "rescale that channel" if "float32" in problem
        else "fix the cell, or check the schema's column names" if "number" in problem
        else "fill or interpolate it, or remove the row"
    ) + "\n"


def test_bad_cells_in_binary_formats(tmp_path: Path) -> None:
    """NPZ and Parquet values are checked alike (NaN stored as a number, a null in Parquet)."""
    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(SCHEMA)
    ax = np.zeros(10)
    ax[[2, 5]] = np.nan
    np.savez(root / "s1.npz", ax=ax, ay=np.zeros(10), act=np.array(["a"] * 10))
    with pytest.raises(DataError, match=r"s1.npz: row 3, column 'ax': is NaN \(and 1 more bad cell\(s\) in the file\)"):
        load_raw(own(root))
    (root / "s1.npz").unlink()
    pd.DataFrame({"ax": pd.array([1.0, None], dtype="Float64"), "ay": [0.0, 0.0], "act": ["a", "a"]}
                 ).to_parquet(root / "s1.parquet")  # fmt: skip
    with pytest.raises(DataError, match=r"s1.parquet: row 2, column 'ax': is empty"):
        load_raw(own(root))


@pytest.mark.parametrize("content, problem", [
    (b"", "the file is empty (0 bytes)"),
    (b"ax,ay,act\n", "the file has columns but no rows"),
])  # fmt: skip
def test_empty_file_is_an_error(tmp_path: Path, content: bytes, problem: str) -> None:
    """An empty file stops verify (as docs/own-data.md says): a failed export must not silently
    remove a subject from the federation."""
    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(SCHEMA)
    table(20, ["a"]).to_csv(root / "s1.csv", index=False)
    (root / "s2.csv").write_bytes(content)
    res = CliRunner().invoke(app, ["data", "verify", "own", "--root", str(root)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith(f"error: {root}/s2.csv: {problem}: export it again, or remove it")


def test_unreadable_file_says_write_it_again(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(SCHEMA)
    (root / "s1.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError) as err:
        load_raw(own(root))
    msg = str(err.value)
    assert msg.startswith(f"{root}/s1.parquet: cannot read it as Parquet (") and "re-download" not in msg
    assert msg.endswith("write the file again (docs/own-data.md, 1. Convert) or remove it from the folder")


def test_clients_without_test_windows_are_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Clients whose split leaves no test window are warned about by name (every view leaves them
    out); when no client has one, the load stops: the run would only ever print n/a."""
    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(SCHEMA)
    for name in ("short1", "short2"):
        table(40, ["a", "b"]).to_csv(root / f"{name}.csv", index=False)  # 2 windows a class: all in the gap
    with pytest.raises(DataError) as err:
        load_federated(own(root, window=8, min_windows=1), 0)
    assert str(err.value).startswith(
        "own: 2 of 2 client(s) have no test windows after the time split (test_fraction 0.3, window 8, "
        "stride 8): sshort1, sshort2; nothing could be evaluated: the time split tests on"
    )
    table(80, ["a", "b"]).to_csv(root / "long.csv", index=False)
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        fd = load_federated(own(root, window=8, min_windows=1), 0)
    assert [len(c.test) for c in fd.clients] == [2, 0, 0]
    msgs = [r.getMessage() for r in caplog.records if "no test windows" in r.getMessage()]
    assert len(msgs) == 1 and msgs[0].startswith(
        "own: 2 of 3 client(s) have no test windows after the time split (test_fraction 0.3, window 8, "
        "stride 8): sshort1, sshort2; every view leaves them out"
    )


def test_a_declared_class_with_no_window_anywhere_is_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The schema names class c; no file has a c row: the model has an output no metric can count."""
    import fedwear
    from fedwear.config import load_config

    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(SCHEMA + "classes: [a, b, c]\n")
    for s in range(3):
        table(200, ["a", "b"], seed=s).to_csv(root / f"s{s}.csv", index=False)
    cfg = load_config(data={"method": "local", "rounds": 1, "local_epochs": 1, "threads": 1, "model": {
        "name": "cnn", "options": {"width": 4}}, "dataset": {"name": "own", "root": str(root), "cache_dir": None,
                                                            "window": 20, "held_out": 0}})
    with caplog.at_level("WARNING", logger="fedwear"):
        fedwear.run(cfg, tmp_path / "run")
    assert "class(es) c have no window in any client" in caplog.text


def test_a_rate_that_changes_within_a_file_is_named_with_its_row(tmp_path: Path) -> None:
    """200 samples at 50 Hz, then 150 at 100 Hz: the file's median interval is still 1/50 s, so
    the median check alone passed it; a single late sample (device jitter) does not trip it."""
    root = tmp_path / "d"
    root.mkdir()
    (root / "schema.yaml").write_text(SCHEMA.replace("rate_hz: 20", "rate_hz: 50") + "timestamp_column: t\n")
    t = table(350, ["a", "b"])
    t["t"] = np.concatenate([np.arange(200) / 50, 4 + np.arange(150) / 100])
    t.to_csv(root / "s1.csv", index=False, float_format="%.6f")
    with pytest.raises(DataError, match=r"s1\.csv: row 2\d\d: from here the timestamps run at 100 Hz, not rate_hz 50 "
                                        r".*the rate changes within the file"):
        load_raw(own(root))
    steady = table(350, ["a", "b"])
    steady["t"] = np.arange(350) / 50
    steady.loc[100, "t"] += 0.015  # one sample 15 ms late
    steady.to_csv(root / "s1.csv", index=False, float_format="%.6f")
    assert len(load_raw(own(root)).recordings) == 1
