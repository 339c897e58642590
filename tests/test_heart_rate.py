"""Heart-rate readers: the real datasets (shared/data/README.md sections 3-5) and small files
written in the same formats."""

from __future__ import annotations

import gzip
import logging
import pickle
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedwear.data.heart_rate import (
    HRSeries,
    natural_key,
    read_distracted_driving,
    read_ppg_dalia,
    read_stress_predict,
)
from fedwear.errors import ConfigError, DataError
from tests.conftest import _missing

# README section 3: values per subject of the PCFedH copy of PPG-DaLiA's ground truth.
PPG_COUNTS = {
    "S1": 4603, "S2": 4099, "S3": 4367, "S4": 4572, "S5": 4649, "S6": 2622, "S7": 4668,
    "S8": 4037, "S9": 4277, "S10": 5321, "S11": 4521, "S12": 3954, "S13": 4565, "S14": 4476,
    "S15": 3966,
}  # fmt: skip

DRIVING_HEADER = (
    '"Time","Drive","Stimulus","Failure","Palm.EDA","Heart.Rate","Breathing.Rate",'
    '"Perinasal.Perspiration","Speed","Acceleration","Brake","Steering","LaneOffset",'
    '"Lane.Position","Distance","Gaze.X.Pos","Gaze.Y.Pos","Lft.Pupil.Diameter",'
    '"Rt.Pupil.Diameter"'
)


def hr_folder(data_root: Path, name: str) -> Path:
    """``data_root/name``; missing fails under FEDWEAR_REQUIRE_DATA=1 (CI), else skips."""
    folder = data_root / name
    if not folder.is_dir():
        _missing(f"real data not found at {folder}: set FEDWEAR_DATA to the shared data folder")
    return folder


def driving_row(time: int, drive: int, hr: str) -> str:
    """One row of a distracted-driving file with ``hr`` in ``Heart.Rate``, ``NA`` elsewhere."""
    cells = [str(time), str(drive), "0", "0", "NA", hr] + ["NA"] * 13
    return ",".join(cells)


def write_ppg(path: Path, values: list[float]) -> None:
    text = "".join(f"{v!r}\n" for v in values)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)


# ----------------------------------------------------------------------------- real data


def test_ppg_dalia_real(data_root: Path) -> None:
    series = read_ppg_dalia(hr_folder(data_root, "ppg_dalia_hr"))
    assert [s.subject for s in series] == list(PPG_COUNTS)  # natural order: S2 before S10
    assert {s.subject: len(s.values) for s in series} == PPG_COUNTS  # first line kept
    assert sum(len(s.values) for s in series) == 64_697
    first = float(Path(series[0].source).read_text().splitlines()[0])
    assert series[0].values[0] == pytest.approx(first)
    for s in series:
        assert s.rate_hz == 0.5 and s.session is None and s.start_unix is None
        assert s.values.dtype == np.float32 and s.values.ndim == 1
        assert s.values.min() > 40.0 and s.values.max() < 190.0  # README: ~41.7 to 187 bpm


def test_distracted_driving_real(data_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = hr_folder(data_root, "distracted_driving")
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        series = read_distracted_driving(root)
    files = sorted(p.name.split(".")[0] for p in root.glob("T*.csv*"))
    assert len(files) == 68
    subjects = list(dict.fromkeys(s.subject for s in series))
    assert subjects == sorted(subjects, key=natural_key)
    # T032 and T088 have no Heart.Rate value in drives 3-7: left out with a warning each.
    assert sorted(set(files) - set(subjects)) == ["T032", "T088"]
    assert "T032" in caplog.text and "T088" in caplog.text
    assert {s.session for s in series} == {f"drive{d}" for d in range(3, 8)}
    for s in series:
        assert s.rate_hz == 1.0 and len(s.values) > 0
        assert np.isfinite(s.values).all() and (s.values != 0).all()
    # SPECS 1.1: 11,574 zero rows (and 8,726 NA rows) in the kept drives.
    kept = sum(len(s.values) for s in series)
    with_zeros = sum(len(s.values) for s in read_distracted_driving(root, drop_zeros=False))
    assert with_zeros - kept == 11_574
    # Per drive, the values are the file's Heart.Rate in order, as pandas reads it.
    t001 = pd.read_csv(root / "T001.csv.gz")
    hr = t001.loc[t001["Drive"] == 5, "Heart.Rate"].dropna()
    expected = hr[hr != 0].to_numpy(np.float32)
    got = next(s for s in series if s.subject == "T001" and s.session == "drive5")
    np.testing.assert_array_equal(got.values, expected)


def test_stress_predict_real(data_root: Path) -> None:
    root = hr_folder(data_root, "stress_predict")
    series = read_stress_predict(root)
    assert [s.subject for s in series] == [f"S{i:02d}" for i in range(1, 36)]
    for s in series:
        lines = Path(s.source).read_text().splitlines()
        assert s.start_unix == float(lines[0]) and s.rate_hz == float(lines[1]) == 1.0
        assert len(s.values) == sum(1 for line in lines[2:] if line.strip())
        assert s.values.min() > 40.0 and s.values.max() < 200.0
    assert series[0].start_unix == 1644226071.0  # README section 5: S01 HR starts then


# ----------------------------------------------------------------------------- PPG-DaLiA files


def test_ppg_gzip_equals_plain(tmp_path: Path) -> None:
    values = [61.25, 62.5, 70.125, 88.0]
    (tmp_path / "plain").mkdir()
    (tmp_path / "gz").mkdir()
    write_ppg(tmp_path / "plain" / "S2.csv", values)
    write_ppg(tmp_path / "plain" / "S10.csv", values[::-1])
    write_ppg(tmp_path / "gz" / "S2.csv.gz", values)
    write_ppg(tmp_path / "gz" / "S10.csv.gz", values[::-1])
    plain, gz = read_ppg_dalia(tmp_path / "plain"), read_ppg_dalia(tmp_path / "gz")
    assert [s.subject for s in plain] == [s.subject for s in gz] == ["S2", "S10"]
    for a, b in zip(plain, gz, strict=True):
        np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(plain[0].values, np.array(values, np.float32))


def test_ppg_plain_preferred_over_gz(tmp_path: Path) -> None:
    write_ppg(tmp_path / "S1.csv", [70.0, 71.0])
    write_ppg(tmp_path / "S1.csv.gz", [99.0])
    (series,) = read_ppg_dalia(tmp_path)
    np.testing.assert_array_equal(series.values, [70.0, 71.0])


def test_ppg_pkl_layout(tmp_path: Path) -> None:
    for name, label in (("S1", [80.5, 81.0, 82.25]), ("S12", [60.0, 61.5])):
        (tmp_path / name).mkdir()
        data = {"label": np.array(label), "subject": name, "activity": np.zeros((4, 1))}
        (tmp_path / name / f"{name}.pkl").write_bytes(pickle.dumps(data, protocol=2))
    series = read_ppg_dalia(tmp_path)
    assert [s.subject for s in series] == ["S1", "S12"]
    np.testing.assert_array_equal(series[0].values, np.array([80.5, 81.0, 82.25], np.float32))
    assert series[1].rate_hz == 0.5 and series[1].values.dtype == np.float32
    # With csv files next to them, the csv layout wins.
    write_ppg(tmp_path / "S1.csv", [70.0])
    (only,) = read_ppg_dalia(tmp_path)
    assert only.source == tmp_path / "S1.csv"


def test_ppg_pkl_without_label(tmp_path: Path) -> None:
    (tmp_path / "S3").mkdir()
    (tmp_path / "S3" / "S3.pkl").write_bytes(pickle.dumps({"signal": {}}))
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "S3" / "S3.pkl"))):
        read_ppg_dalia(tmp_path)


def test_ppg_header_line_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "S1.csv").write_text("hr\n70.0\n71.0\n")
    with pytest.raises(DataError, match=r"S1\.csv, line 1: 'hr' is not a number"):
        read_ppg_dalia(tmp_path)


# ----------------------------------------------------------------------------- distracted driving


def test_distracted_cleaning(tmp_path: Path) -> None:
    rows = [
        driving_row(1, 1, "90"),  # drive 1: dropped
        driving_row(2, 1, "91"),
        driving_row(1, 3, "70.5"),
        driving_row(2, 3, "NA"),  # missing: removed, gap closed
        driving_row(3, 3, "72"),
        driving_row(4, 3, "0"),  # zero HR: removed
        driving_row(5, 3, "73"),
        driving_row(1, 4, "NA"),  # drive 4 has no value: no series
        driving_row(1, 7, "80"),
        driving_row(1, 8, "95"),  # drive 8: dropped
    ]
    text = DRIVING_HEADER + "\n" + "\n".join(rows) + "\n"
    (tmp_path / "T010.csv.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    (tmp_path / "T002.csv").write_text(DRIVING_HEADER + "\n" + driving_row(1, 5, "66") + "\n")
    series = read_distracted_driving(tmp_path)
    assert [(s.subject, s.session) for s in series] == [
        ("T002", "drive5"),
        ("T010", "drive3"),
        ("T010", "drive7"),
    ]
    np.testing.assert_array_equal(series[1].values, np.array([70.5, 72.0, 73.0], np.float32))
    np.testing.assert_array_equal(series[2].values, [80.0])
    assert all(s.rate_hz == 1.0 and s.values.dtype == np.float32 for s in series)
    raw = read_distracted_driving(tmp_path, drives=(1, 3), drop_zeros=False)
    assert [(s.subject, s.session) for s in raw] == [("T010", "drive1"), ("T010", "drive3")]
    np.testing.assert_array_equal(raw[1].values, [70.5, 72.0, 0.0, 73.0])


def test_distracted_subject_without_hr_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "T001.csv").write_text(DRIVING_HEADER + "\n" + driving_row(1, 3, "NA") + "\n")
    (tmp_path / "T003.csv").write_text(DRIVING_HEADER + "\n" + driving_row(1, 3, "75") + "\n")
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        series = read_distracted_driving(tmp_path)
    assert [s.subject for s in series] == ["T003"]
    assert "T001.csv" in caplog.text


def test_distracted_errors(tmp_path: Path) -> None:
    (tmp_path / "T001.csv").write_text(DRIVING_HEADER + "\n")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'T001.csv'} has a header but")):
        read_distracted_driving(tmp_path)
    (tmp_path / "T001.csv").write_text("")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'T001.csv'} is empty")):
        read_distracted_driving(tmp_path)
    (tmp_path / "T001.csv").write_text('"Time","Drive"\n1,3\n')
    with pytest.raises(DataError, match=r"T001\.csv has no column\(s\) Heart\.Rate"):
        read_distracted_driving(tmp_path)
    with pytest.raises(ConfigError, match="drives is empty"):
        read_distracted_driving(tmp_path, drives=())


# ----------------------------------------------------------------------------- Stress-Predict


def test_stress_predict_empatica(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    raw = tmp_path / "Raw_data"
    for name in ("S2", "S10", "S3"):
        (raw / name).mkdir(parents=True)
    (raw / "S2" / "HR.csv").write_text("1644226071.000000\n1.000000\n83.00\n83.00\n72.67\n")
    gz = "1644227584.000000\n1.000000\n60.5\n61.25\n"
    (raw / "S10" / "HR.csv.gz").write_bytes(gzip.compress(gz.encode(), mtime=0))
    (raw / "S3" / "EDA.csv").write_text("1644226061.0\n4.0\n0.1\n")  # no HR.csv
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        series = read_stress_predict(tmp_path)
    assert [s.subject for s in series] == ["S2", "S10"]
    assert str(raw / "S3") in caplog.text
    s2, s10 = series
    assert s2.start_unix == 1644226071.0 and s2.rate_hz == 1.0
    np.testing.assert_array_equal(s2.values, np.array([83.0, 83.0, 72.67], np.float32))
    assert s10.start_unix == 1644227584.0 and s10.source == raw / "S10" / "HR.csv.gz"
    np.testing.assert_array_equal(s10.values, [60.5, 61.25])


def test_stress_predict_rate_from_file(tmp_path: Path) -> None:
    (tmp_path / "Raw_data" / "S01").mkdir(parents=True)
    (tmp_path / "Raw_data" / "S01" / "HR.csv").write_text("100.0\n4.000000\n1\n2\n3\n")
    (series,) = read_stress_predict(tmp_path)
    assert series.rate_hz == 4.0 and series.start_unix == 100.0 and len(series.values) == 3


def test_stress_predict_errors(tmp_path: Path) -> None:
    hr = tmp_path / "Raw_data" / "S01" / "HR.csv"
    hr.parent.mkdir(parents=True)
    hr.write_text("1644226071.000000\n1.000000\n")
    with pytest.raises(DataError, match=re.escape(f"{hr} holds no heart-rate values")):
        read_stress_predict(tmp_path)
    hr.write_text("")
    with pytest.raises(DataError, match=re.escape(f"{hr} holds no heart-rate values")):
        read_stress_predict(tmp_path)
    hr.write_text("1644226071.000000\n0\n70\n")
    with pytest.raises(DataError, match=r"line 2: sample rate 0\.0 Hz is not positive"):
        read_stress_predict(tmp_path)
    hr.unlink()
    with pytest.raises(DataError, match=r"no HR\.csv in any subject folder"):
        read_stress_predict(tmp_path)


# ----------------------------------------------------------------------------- errors, ordering


@pytest.mark.parametrize("reader", [read_ppg_dalia, read_distracted_driving, read_stress_predict])
def test_missing_root_and_no_files(reader, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(DataError, match=re.escape(f"{str(missing)!r} does not exist")) as err:
        reader(missing)
    assert "\n" not in str(err.value)
    (tmp_path / "README.md").write_text("not data\n")
    with pytest.raises(DataError, match=re.escape(str(tmp_path))) as err:
        reader(tmp_path)
    assert "found under" in str(err.value) and "\n" not in str(err.value)


def test_empty_ppg_file(tmp_path: Path) -> None:
    (tmp_path / "S4.csv").write_text("")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'S4.csv'} holds no heart-rate")):
        read_ppg_dalia(tmp_path)


def test_natural_key_and_series() -> None:
    names = ["S10", "S2", "T088", "S1"]
    assert sorted(names, key=natural_key) == ["S1", "S2", "S10", "T088"]
    s = HRSeries("S1", np.zeros(3, np.float32), 0.5)
    assert len(s) == 3 and s.session is None and s.start_unix is None


def test_verify_names_the_forecasting_target_not_classes(tmp_path: Path) -> None:
    """``fedwear data verify`` on a forecasting dataset reports its series, never "0 classes"."""
    from typer.testing import CliRunner

    from fedwear.cli import app

    write_ppg(tmp_path / "S1.csv", [70.0, 71.5, 69.0])
    write_ppg(tmp_path / "S2.csv.gz", [88.0, 90.25])
    res = CliRunner().invoke(app, ["data", "verify", "ppg_dalia_hr", "--root", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "read: 2 subjects, 2 recordings, 5 samples, forecasting target hr (values 69.0 to 90.2)" in res.stdout
    assert "classes" not in res.stdout
