"""Format tests of the loaders of datasets not in shared/data: each test writes a few seconds of
a few subjects in the dataset's own distribution format (file names, columns, units, label
codes, zips), loads them and checks what comes out, so a change of format in a loader breaks a
test. Also: the papers' presets, the faithful switch, the damage warnings, download entries."""

from __future__ import annotations

import gzip
import io
import logging
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.io as sio
from typer.testing import CliRunner

from fedwear.cli import app
from fedwear.data import (
    DATASETS,
    card,
    dataset_info,
    dataset_status,
    extrasensory,
    harbox,
    hhar,
    load_federated,
    load_raw,
    pamap2,
    unimib_shar,
    wisdm,
)
from fedwear.data import download as dl
from fedwear.data.config import PRESETS, DatasetConfig
from fedwear.data.types import UNLABELLED
from fedwear.errors import ConfigError, DataError

NEW = ["pamap2", "unimib_shar", "harbox", "hhar", "realworld", "extrasensory", "wisdm_ar"]


def cfg(name: str, root: Path, **kw: object) -> DatasetConfig:
    return DatasetConfig(name=name, root=str(root), cache_dir=None, **kw)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fedwear"]


# ----------------------------------------------------------------------------- PAMAP2


def pamap2_row_block(t0: float, n: int, activity: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` rows of the 54 PAMAP2 columns at 100 Hz; heart rate only on every 10th row."""
    rows = np.empty((n, 54))
    rows[:, 0] = t0 + np.arange(n) / 100.0
    rows[:, 1] = activity
    rows[:, 2] = np.nan
    rows[::10, 2] = 100 + activity
    for k in range(3):
        imu = 3 + 17 * k
        rows[:, imu] = 30.0 + k  # temperature
        rows[:, imu + 1 : imu + 13] = rng.normal(activity, 1.0, (n, 12))
        rows[:, imu + 13 : imu + 17] = [1, 0, 0, 0]  # orientation (invalid per the readme)
    return rows


def write_pamap2(root: Path, seconds: float = 3.0) -> Path:
    rng = np.random.default_rng(0)
    n = int(seconds * 100)
    plan = {("Protocol", 101): [1, 0, 4, 24], ("Protocol", 102): [2, 0, 4], ("Optional", 101): [9, 20]}
    for (session, subject), acts in plan.items():
        blocks, t = [], 5.0
        for a in acts:
            blocks.append(pamap2_row_block(t, n, a, rng))
            t += n / 100
        data = np.concatenate(blocks)
        data[50, 4:7] = np.nan  # a dropped packet of the hand IMU's acc16
        (root / session).mkdir(parents=True, exist_ok=True)
        text = "\n".join(" ".join("NaN" if np.isnan(v) else f"{v:.6g}" for v in row) for row in data)
        (root / session / f"subject{subject}.dat").write_text(text + "\n")
    return root


def test_pamap2_format(tmp_path: Path) -> None:
    root = write_pamap2(tmp_path / "PAMAP2_Dataset")
    raw = load_raw(cfg("pamap2", root))
    assert [(r.subject, r.session) for r in raw.recordings] == [
        ("101", "protocol"), ("101", "optional"), ("102", "protocol"),
    ]  # fmt: skip
    r = raw.recordings[0]
    assert r.signal.shape == (1200, 40) and r.rate_hz == 100.0 and r.signal.dtype == np.float32
    assert r.channels[0] == "heart_rate" and r.channels[1] == "hand_temp"
    assert r.channels[-1] == "ankle_mag_z" and "hand_acc16_x" in r.channels
    # labels: ID 1 -> lying (0), transient 0 -> unlabelled, 4 -> walking (3), 24 -> rope jumping
    assert r.labels[0] == 0 and r.labels[300] == UNLABELLED and r.labels[600] == 3
    assert raw.class_names[r.labels[900]] == "rope jumping"
    # NaNs filled by interpolation in time: heart rate between readings, the dropped packet
    assert np.isfinite(r.signal).all()
    assert r.signal[5, 0] == pytest.approx(101.0)
    ch = r.channels.index("hand_acc16_x")
    src = np.loadtxt(root / "Protocol/subject101.dat")
    assert r.signal[50, ch] == pytest.approx((src[49, 4] + src[51, 4]) / 2, rel=1e-4)
    assert r.signal[10, r.channels.index("chest_temp")] == pytest.approx(31.0)  # column 21


def test_pamap2_preset_and_errors(tmp_path: Path) -> None:
    root = write_pamap2(tmp_path / "p", seconds=12.0)
    c = cfg("pamap2", root, preset="protohar", drop_classes=0, min_windows=1)
    assert c.window == 171 and c.rate_hz == pytest.approx(100 / 3) and c.split == "fewshot"
    fd = load_federated(c, 0)
    assert fd.rate_hz == pytest.approx(100 / 3) and fd.window == 171
    assert fd.channels == pamap2.CHANNELS and len(fd.class_names) == 12
    assert set(fd.class_names) == {pamap2.CLASS_NAMES[pamap2.ACTIVITY_IDS.index(a)] for a in pamap2.PROTOCOL_IDS}
    assert all(c.train.x.shape[1:] == (171, 40) for c in fd.clients)
    bad = root / "Protocol/subject102.dat"
    bad.write_text(bad.read_text().replace(" 4 ", " 8 ", 1))
    with pytest.raises(DataError, match=r"subject102\.dat: line \d+: activity ID 8 is not"):
        load_raw(cfg("pamap2", root))
    bad.write_text("1 2 3\n")
    with pytest.raises(DataError, match=r"cannot read .*subject102\.dat .*54 columns") as err:
        load_raw(cfg("pamap2", root))
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- UniMiB-SHAR


def write_unimib(root: Path, n: int = 40) -> Path:
    rng = np.random.default_rng(1)
    (root / "data").mkdir(parents=True)
    act = np.arange(n) % 17 + 1
    subject = np.where(np.arange(n) < n // 2, 3, 7)
    x = rng.normal(0, 1, (n, 453))
    x[:, :151] += act[:, None]  # x axis carries the class, y and z offsets mark the axis
    x[:, 151:302] += 100
    x[:, 302:] += 200
    sio.savemat(root / "data/acc_data.mat", {"acc_data": x})
    sio.savemat(root / "data/acc_labels.mat", {"acc_labels": np.stack([act, subject, np.arange(n) % 2 + 1], 1)})
    names = np.empty((2, 17), dtype=object)
    names[0] = [f"N{k}" for k in range(1, 18)]
    names[1] = ["ADL" if k < 9 else "FALL" for k in range(17)]
    sio.savemat(root / "data/acc_names.mat", {"acc_names": names})
    return root


def test_unimib_format_and_preset(tmp_path: Path) -> None:
    root = write_unimib(tmp_path / "UniMiB-SHAR")
    raw = load_raw(cfg("unimib_shar", root))
    assert raw.class_names == [f"N{k}" for k in range(1, 18)]  # from acc_names.mat
    assert len(raw.recordings) == 40 and {r.subject for r in raw.recordings} == {"3", "7"}
    r = raw.recordings[5]
    assert r.signal.shape == (151, 3) and r.rate_hz == 50.0 and set(r.labels) == {5}
    assert abs(r.signal[:, 1].mean() - 100) < 1 and abs(r.signal[:, 2].mean() - 200) < 1
    assert abs(r.signal[:, 0].mean() - 6) < 1
    (root / "data/acc_names.mat").unlink()
    assert load_raw(cfg("unimib_shar", root)).class_names == unimib_shar.CLASS_NAMES
    fd = load_federated(cfg("unimib_shar", root, preset="protohar", drop_classes=0, min_windows=1), 0)
    assert fd.info["num_windows"] == 40  # one window per shipped window, nothing cut
    sio.savemat(root / "data/acc_labels.mat", {"acc_labels": np.ones((39, 3))})
    with pytest.raises(DataError, match="expected 40 x 3 labels"):
        load_raw(cfg("unimib_shar", root))


# ----------------------------------------------------------------------------- HARBox


def write_harbox(root: Path) -> Path:
    """User k, class c, sample s, step j, column m holds 1000 s + 10 j + m (+ 10000 c)."""
    for user, classes in {1: ["Walk", "Hop"], 2: ["Call", "typing", "Wave"]}.items():
        (root / str(user)).mkdir(parents=True)
        for c in classes:
            s, j, m = np.meshgrid(np.arange(2), np.arange(100), np.arange(10), indexing="ij")
            vals = 1000 * s + 10 * j + m + 10000 * harbox.CLASS_NAMES.index(c)
            rows = vals.reshape(-1, 10)
            np.savetxt(root / str(user) / f"{c}_train.txt", rows, fmt="%d")
    (root / "3").mkdir()  # a user folder without files
    return root


def test_harbox_format(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = write_harbox(tmp_path / "large_scale_HARBox")
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        raw = load_raw(cfg("harbox", tmp_path))  # the parent folder works too
    assert any("3 holds no" in m for m in warnings_of(caplog))
    assert [(r.subject, r.session) for r in raw.recordings[:4]] == [
        ("1", "Hop0"), ("1", "Hop1"), ("1", "Walk0"), ("1", "Walk1"),
    ]  # fmt: skip
    r = raw.recordings[1]  # Hop, sample 1
    assert r.signal.shape == (100, 9) and set(r.labels) == {1}
    assert r.signal[0, 0] == 10000 + 1000 + 1  # column 0 dropped: channel 0 is column 1
    assert r.signal[7, 8] == 10000 + 1000 + 70 + 9
    fd = load_federated(cfg("harbox", root, preset="protohar", drop_classes=0, min_windows=1), 0)
    assert fd.window == 100 and fd.info["num_windows"] == 10
    (root / "1" / "Walk_train.txt").write_text("1 2 3\n")
    with pytest.raises(DataError, match=r"Walk_train\.txt .*multiple of 100 x 10"):
        load_raw(cfg("harbox", root))


# ----------------------------------------------------------------------------- HHAR

T0 = 1_424_696_633_000_000_000  # ns


def acc_f(t: np.ndarray) -> np.ndarray:
    return np.stack([np.sin(t), np.cos(t), t / 10], 1)


def gyr_f(t: np.ndarray) -> np.ndarray:
    return np.stack([np.sin(2 * t), np.cos(3 * t), -t / 10], 1)


def write_hhar(root: Path, seconds: float = 4.0) -> Path:
    """Users a, b with nexus4_1 (200 Hz) and s3mini_1 (100 Hz): sit, walk, then a 1 s bike run,
    then null; the gyro starts 0.25 s and a third of a sample later and runs 3 samples longer."""
    root.mkdir(parents=True)
    acc_rows, gyr_rows = [], []
    for user in "ab":
        for device, model, rate in (("nexus4_1", "nexus4", 200.0), ("s3mini_1", "s3mini", 100.0)):
            n = int(seconds * rate)
            labels = ["sit"] * n + ["walk"] * n + ["bike"] * int(rate) + ["null"] * int(rate / 2)
            t = np.arange(len(labels)) / rate
            tg = np.arange(len(labels) + 3) / rate + 0.25 + 1 / (3 * rate)
            for rows, times, f in ((acc_rows, t, acc_f), (gyr_rows, tg, gyr_f)):
                xyz = f(times)
                for k in range(len(times)):
                    rows.append([0, 0, T0 + int(round(times[k] * 1e9)), *xyz[k], user, model, device,
                                 labels[min(k, len(labels) - 1)]])  # fmt: skip
    for name, rows in (("Phones_accelerometer.csv", acc_rows), ("Phones_gyroscope.csv", gyr_rows)):
        df = pd.DataFrame(rows, columns=hhar.HEADER)
        df["Index"] = np.arange(len(df))
        df["Arrival_Time"] = df["Creation_Time"] // 1_000_000
        df.to_csv(root / name, index=False)
    return root


def test_hhar_corrected_alignment(tmp_path: Path) -> None:
    root = write_hhar(tmp_path / "Activity recognition exp")
    raw = load_raw(cfg("hhar", tmp_path))  # the parent of 'Activity recognition exp' works
    assert raw.class_names == ["sit", "stand", "walk", "stairsup", "stairsdown", "bike"]
    assert {(r.subject, r.meta["device"], r.meta["unit"]) for r in raw.recordings} == {
        (u, m, d) for u in "ab" for m, d in (("nexus4", "nexus4_1"), ("s3mini", "s3mini_1"))
    }
    r = next(r for r in raw.recordings if r.subject == "a" and r.meta["device"] == "nexus4")
    assert r.rate_hz == 200.0 and r.signal.shape[1] == 6 and r.channels == hhar.CHANNELS
    t = np.arange(len(r.labels)) / 200.0 + 0.25 + 1 / 600  # the grid starts where both have data
    assert np.allclose(r.signal[:, :3], acc_f(t), atol=2e-3)
    assert np.allclose(r.signal[:, 3:], gyr_f(t), atol=2e-3)  # gyro at the same instants
    assert raw.class_names[r.labels[10]] == "sit" and raw.class_names[r.labels[1000]] == "walk"
    assert (r.labels == 5).sum() >= 190 and r.labels[-1] == UNLABELLED  # bike, then null
    with pytest.raises(ConfigError, match="recordings at 100, 200 Hz: set dataset.rate_hz"):
        load_federated(cfg("hhar", root, window=32), 0)
    c = cfg("hhar", root, preset="fedali", split="stratified", purge=False)  # too short for a time split
    assert c.client_by == ["subject", "device"] and c.normalize_group == ["device"]
    fd = load_federated(c, 0)
    assert fd.rate_hz == 50.0 and [x.client_id for x in fd.clients] == [
        "sa-nexus4", "sa-s3mini", "sb-nexus4", "sb-s3mini",
    ]  # fmt: skip
    assert set(fd.info["normalize"]["groups"]) == {"device=nexus4", "device=s3mini"}


def test_hhar_faithful_row_index_pairing(tmp_path: Path) -> None:
    root = write_hhar(tmp_path / "h")
    raw = load_raw(cfg("hhar", root, faithful=True))
    acc = pd.read_csv(root / "Phones_accelerometer.csv")
    gyr = pd.read_csv(root / "Phones_gyroscope.csv")
    r = next(r for r in raw.recordings if r.subject == "b" and r.meta["device"] == "s3mini")
    pos = np.flatnonzero(((acc["User"] == "b") & (acc["Model"] == "s3mini")).to_numpy())
    assert np.allclose(r.signal[:, :3], acc[["x", "y", "z"]].to_numpy()[pos])
    assert np.allclose(r.signal[:, 3:], gyr[["x", "y", "z"]].to_numpy()[pos])  # rows, not times
    # FedAli's run filter: s3mini keeps runs >= 384 samples, so the 100-sample bike run goes
    assert (r.labels == 5).sum() == 0 and (r.labels == 0).sum() == 400
    nexus = next(r for r in raw.recordings if r.subject == "a" and r.meta["device"] == "nexus4")
    assert (nexus.labels == 5).sum() == 0 and (nexus.labels == 2).sum() == 800  # 200 < 512


# ----------------------------------------------------------------------------- RealWorld


def rw_csv(t_ms: np.ndarray, xyz: np.ndarray) -> bytes:
    df = pd.DataFrame({"id": np.arange(1, len(t_ms) + 1), "attr_time": t_ms,
                       "attr_x": xyz[:, 0], "attr_y": xyz[:, 1], "attr_z": xyz[:, 2]})  # fmt: skip
    return df.to_csv(index=False).encode()


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def write_realworld(root: Path, seconds: float = 6.0, gyro_short: int = 0) -> Path:
    """Probands 1, 2: walking at chest and forearm in one part; sitting in two parts (nested
    zips) at chest. Gyro starts 7 ms later; ``gyro_short`` drops that many gyro samples."""
    n = int(seconds * 50)
    for subject in (1, 2):
        data = root / f"proband{subject}" / "data"
        data.mkdir(parents=True)
        t_ms = 1_435_000_000_000 + subject * 10**7 + np.arange(n) * 20
        for activity, parts in (("walking", [None]), ("sitting", [2, 3])):
            acc, gyr = {}, {}
            for part in parts:
                suffix = f"_{part}" if part else ""
                for pos in (["chest", "forearm"] if activity == "walking" else ["chest"]):
                    tt = (t_ms - t_ms[0]) / 1000.0
                    a = rw_csv(t_ms, acc_f(tt))
                    tg = t_ms[: n - gyro_short] + 7
                    g = rw_csv(tg, gyr_f((tg - t_ms[0]) / 1000.0))
                    acc[f"acc_{activity}{suffix}_{pos}.csv"] = a
                    gyr[f"Gyroscope_{activity}{suffix}_{pos}.csv"] = g
            if parts == [None]:
                (data / f"acc_{activity}_csv.zip").write_bytes(zip_bytes(acc))
                (data / f"gyr_{activity}_csv.zip").write_bytes(zip_bytes(gyr))
            else:  # one nested zip per part
                for sensor, members in (("acc", acc), ("gyr", gyr)):
                    inner = {
                        f"{sensor}_{activity}_{p}_csv.zip": zip_bytes({k: v for k, v in members.items() if f"_{p}_" in k})
                        for p in parts
                    }
                    (data / f"{sensor}_{activity}_csv.zip").write_bytes(zip_bytes(inner))
    (root / "proband3" / "data").mkdir(parents=True)
    return root


def test_realworld_format(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = write_realworld(tmp_path / "realworld2016_dataset")
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        raw = load_raw(cfg("realworld", root))
    assert any("proband3 holds no" in m for m in warnings_of(caplog))
    sessions = [(r.subject, r.session) for r in raw.recordings]
    assert sessions == [  # by subject, activity (in FedAli's label order), part, position
        ("1", "sitting_2-chest"), ("1", "sitting_3-chest"), ("1", "walking-chest"), ("1", "walking-forearm"),
        ("2", "sitting_2-chest"), ("2", "sitting_3-chest"), ("2", "walking-chest"), ("2", "walking-forearm"),
    ]  # fmt: skip
    r = raw.recordings[3]
    assert r.meta == {"position": "forearm", "device": "watch"} and raw.recordings[0].meta["device"] == "phone"
    assert raw.class_names[r.labels[0]] == "walking" and r.rate_hz == 50.0
    t = np.arange(len(r.labels)) / 50.0 + 0.007
    assert np.allclose(r.signal[:, :3], acc_f(t), atol=2e-3)
    assert np.allclose(r.signal[:, 3:], gyr_f(t), atol=5e-3)
    c = cfg("realworld", root, preset="fedali", split="stratified", purge=False)  # too short for a time split
    fd = load_federated(c, 0)
    assert [x.client_id for x in fd.clients] == ["s01-chest", "s01-forearm", "s02-chest", "s02-forearm"]
    assert set(fd.info["normalize"]["groups"]) == {"device=phone", "device=watch"}


def test_realworld_faithful_gyro_from_acc(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = write_realworld(tmp_path / "rw", seconds=8.0, gyro_short=150)  # acc longer by 150 > 100
    raw = load_raw(cfg("realworld", root, faithful=True))
    r = raw.recordings[0]
    assert len(r.labels) == 400 - 150  # cut to the shorter length
    # the code's bug: "gyro" is the acc signal resampled to the gyro's length (250 samples)
    from scipy.signal import resample

    acc = acc_f(np.arange(400) / 50.0)
    assert np.allclose(r.signal[:, :3], acc[:250], atol=1e-5)
    assert np.allclose(r.signal[:, 3:], resample(acc, 250, axis=0), atol=1e-4)
    fixed = load_raw(cfg("realworld", root)).recordings[0]
    t = np.arange(len(fixed.labels)) / 50.0 + 0.007
    assert np.allclose(fixed.signal[:, 3:], gyr_f(t), atol=5e-3)  # corrected: the real gyro
    root2 = write_realworld(tmp_path / "rw2", seconds=30.0, gyro_short=1200)  # counts differ > 10
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        skipped = load_raw(cfg("realworld", root2, faithful=True))
    assert len(skipped.recordings) < 8
    assert any("window counts differ by more than 10: skipped" in m for m in warnings_of(caplog))


# ----------------------------------------------------------------------------- ExtraSensory


def write_extrasensory(root: Path) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(2)
    plan = {"0A986513-7828-4D53-AA1F-E02D6DF9561B": [1444000000, 1444000060, 1444000120],
            "1155FF54-63D3-4AB2-9863-8385D0BD0A13": [1445000000, 1445000060]}  # fmt: skip
    for u, (uuid, stamps) in enumerate(plan.items()):
        rows = []
        for k, ts in enumerate(stamps):
            marks = {f"label:{n}": 0.0 for n in extrasensory.LABELS}
            if k == 0:
                marks[f"label:{extrasensory.LABELS[3 + u]}"] = 1.0  # walking / running
            elif k == 1:
                marks["label:SITTING"], marks["label:OR_standing"] = 1.0, 1.0  # two: unlabelled
            rows.append({"timestamp": ts, "raw_acc:magnitude_stats:mean": rng.normal(), **marks,
                         "label:PHONE_IN_POCKET": np.nan, "label_source": 2})  # fmt: skip
            for sensor, off in (("raw_acc", 0.0), ("proc_gyro", 0.01)):
                (root / sensor / uuid).mkdir(parents=True, exist_ok=True)
                path = root / sensor / uuid / f"{ts}.m_{sensor}.dat"
                if sensor == "proc_gyro" and u == 1 and k == 1:
                    path.write_text("nan\n")  # the phone recorded nothing
                    continue
                t = 5000.0 + off + np.arange(200) / 40.0
                xyz = acc_f(t - 5000) if sensor == "raw_acc" else gyr_f(t - 5000)
                np.savetxt(path, np.column_stack([t, xyz]), fmt="%.6f")
        with gzip.open(root / f"{uuid}.features_labels.csv.gz", "wt") as fh:
            pd.DataFrame(rows).to_csv(fh, index=False)
    return root


def test_extrasensory_format(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = write_extrasensory(tmp_path / "es")
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        raw = load_raw(cfg("extrasensory", root))
    assert any("1 of 2 examples lack" in m for m in warnings_of(caplog))
    assert [r.session for r in raw.recordings] == ["1444000000", "1444000060", "1444000120", "1445000000"]
    walk, both, none_, run = raw.recordings
    assert set(walk.labels) == {3} and set(run.labels) == {4}
    assert set(both.labels) == {UNLABELLED} and set(none_.labels) == {UNLABELLED}
    assert walk.signal.shape[1] == 6 and walk.rate_hz == 40.0
    t = np.arange(len(walk.labels)) / 40.0 + 0.01
    assert np.allclose(walk.signal[:, 3:], gyr_f(t), atol=2e-3)
    bad = next((root / "raw_acc").glob("*/1444000060.m_raw_acc.dat"))
    bad.write_text("1 2 3\n")
    with pytest.raises(DataError, match=r"1444000060\.m_raw_acc\.dat .*rows of 4"):
        load_raw(cfg("extrasensory", root))


# ----------------------------------------------------------------------------- WISDM


def write_wisdm(root: Path, users: tuple[int, ...] = (7, 33)) -> Path:
    """Records as in WISDM_ar_v1.1_raw.txt: ``user,activity,ns,x,y,z;`` at 20 Hz, with the raw
    file's quirks: two records on one line, a truncated record, a timestamp of 0."""
    root.mkdir(parents=True)
    lines = []
    t = 49_105_962_326_000
    for user in users:
        for activity in ("Jogging", "Walking", "Sitting"):
            for k in range(80):
                t += 50_000_000
                lines.append(f"{user},{activity},{t},{k / 10:.4f},{9.8:.4f},{-k / 20:.4f};")
            t += 5_000_000_000  # a break between activities
    lines[10] = lines[10] + lines[11]  # two records on one line
    lines[11] = "33,Jogging,49106332290000,-1.1,;"  # truncated
    lines[20] = "7,Jogging,0,0.0,0.0,0.0;"
    (root / "WISDM_ar_v1.1_raw.txt").write_text("\n".join(lines) + "\n")
    return root


def test_wisdm_format(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = write_wisdm(tmp_path / "WISDM_ar_v1.1")
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        raw = load_raw(cfg("wisdm_ar", tmp_path))
    assert any("1 malformed record(s) dropped (first at line 12)" in m for m in warnings_of(caplog))
    assert raw.class_names == wisdm.CLASS_NAMES
    assert [(r.subject, r.session) for r in raw.recordings] == [
        ("7", "r0"), ("7", "r1"), ("7", "r2"), ("33", "r0"), ("33", "r1"), ("33", "r2"),
    ]  # fmt: skip
    first = raw.recordings[0]
    assert set(first.labels) == {1} and first.rate_hz == 20.0 and first.signal[0, 1] == pytest.approx(9.8)
    assert len(first.labels) == 79  # the record with timestamp 0 is dropped
    assert np.allclose(first.signal[10:12, 0], [1.0, 1.1])  # the two records of line 11 kept
    lines = (root / "WISDM_ar_v1.1_raw.txt").read_text().splitlines()
    (root / "WISDM_ar_v1.1_raw.txt").write_text("\n".join(ln[:-12] for ln in lines) + "\n")
    with pytest.raises(DataError, match="records are malformed .*re-download"):
        load_raw(cfg("wisdm_ar", root))


# ----------------------------------------------------------------------------- all of them


WRITERS = {
    "pamap2": lambda p: write_pamap2(p), "unimib_shar": lambda p: write_unimib(p),
    "harbox": lambda p: write_harbox(p), "hhar": lambda p: write_hhar(p),
    "realworld": lambda p: write_realworld(p), "extrasensory": lambda p: write_extrasensory(p),
    "wisdm_ar": lambda p: write_wisdm(p),
}  # fmt: skip


def test_every_dataset_has_a_loader_card_download_and_status(tmp_path: Path) -> None:
    for name in NEW:
        mod = DATASETS[name]
        assert name == mod.NAME and mod.__doc__ and len(mod.__doc__) > 800, name
        c = card(name)
        for key in ("subjects", "classes", "rates", "licence", "citation", "url"):
            assert c.get(key) not in (None, ""), (name, key)
        src = dl.source(name)
        assert src.url.startswith("http") and src.archive_sha256 is None and not src.pinned_files
        assert "not pinned" in src.archive_pin
        WRITERS[name](tmp_path / name)
        status, folder = dataset_status(name, tmp_path)
        assert folder == tmp_path / name and status.startswith(("found", "incomplete")), (name, status)
    res = CliRunner().invoke(app, ["data", "list", "--root", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = {ln.split()[0]: ln for ln in res.stdout.splitlines()}
    assert "not found" in rows["usc_had"] and "generated" in rows["synthetic"]
    assert "found: 5 files" in rows["harbox"] and "incomplete: 2/9 protocol files" in rows["pamap2"]
    res = CliRunner().invoke(app, ["data", "info", "hhar"])
    assert res.exit_code == 0 and '"citation"' in res.stdout and "SenSys 2015" in res.stdout


def test_verify_reads_unpinned_datasets(tmp_path: Path) -> None:
    root = write_unimib(tmp_path / "u")
    res = CliRunner().invoke(app, ["data", "verify", "unimib_shar", "--root", str(root)])
    assert res.exit_code == 0, res.output
    assert "no per-file SHA-256 is pinned" in res.stdout and "read: 2 subjects, 40 recordings" in res.stdout
    (root / "data/acc_names.mat").unlink()
    res = CliRunner().invoke(app, ["data", "verify", "unimib_shar", "--root", str(root)])
    assert res.exit_code == 2 and "acc_names.mat" in res.stderr
    root = write_wisdm(tmp_path / "w")
    (root / "WISDM_ar_v1.1_raw.txt").write_bytes(b"\xff\xfe garbage")
    res = CliRunner().invoke(app, ["data", "verify", "wisdm_ar", "--root", str(root)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "WISDM_ar_v1.1_raw.txt" in res.stderr


def test_unpinned_download_records_the_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local archive (file:// URL, no network): the hash is printed and recorded, not pinned."""
    import hashlib
    import json

    folder = write_unimib(tmp_path / "src" / "UniMiB-SHAR")
    archive = tmp_path / "UniMiB-SHAR.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(folder.parent).as_posix())
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    target = tmp_path / "data" / "unimib"
    res = CliRunner().invoke(app, ["data", "download", "unimib_shar", "--root", str(target),
                                   "--url", archive.as_uri(), "--quiet"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert f"archive SHA-256 {digest}" in res.stdout and "not checked against any pinned value" in res.stdout
    assert "read: 2 subjects, 40 recordings" in res.stdout
    record = json.loads((target / dl.RECORD).read_text())
    assert record["pinned"] is False and record["archives"][0]["sha256"] == digest


def test_damage_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Short recordings and clients lacking a class are warned about by name; a corrupt file
    stops with one line naming it."""
    root = write_pamap2(tmp_path / "p", seconds=3.0)
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        load_federated(cfg("pamap2", root, window=128, stride=128, min_windows=1, split="stratified"), 0)
    msgs = warnings_of(caplog)
    assert any("client(s) have no window of some classes" in m and "s102 (lying" in m for m in msgs), msgs
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedwear"):  # user 7's jogging has 79 records
        load_federated(cfg("wisdm_ar", write_wisdm(tmp_path / "w"), window=80, min_windows=1, split="stratified"), 0)
    assert any("1 recording(s) shorter than one window of 80 samples give no window: subject 7 r0 (79 samples)"
               in m for m in warnings_of(caplog)), warnings_of(caplog)
    (root / "Protocol/subject101.dat").write_bytes(b"\x00\x01garbage\n")
    with pytest.raises(DataError) as err:
        load_raw(cfg("pamap2", root))
    assert "subject101.dat" in str(err.value) and "\n" not in str(err.value)


def test_presets_are_documented() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "datasets.md").read_text()
    for name, presets in PRESETS.items():
        for preset, keys in presets.items():
            assert f"`{name}` | `{preset}`" in doc, (name, preset)
            for key in keys:
                assert f"{key}:" in doc, (name, preset, key)
    with pytest.raises(Exception, match="is not a preset of dataset 'usc_had'"):
        DatasetConfig(name="usc_had", preset="fedali")


def test_info_counts(tmp_path: Path) -> None:
    info = dataset_info("realworld", write_realworld(tmp_path / "rw"))
    assert info["subjects"] == 2 and info["meta"] == {"device": ["phone", "watch"], "position": ["chest", "forearm"]}
