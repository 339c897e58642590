"""``fedwear report``: PNGs plus one self-contained HTML page whose numbers match summary.json."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import fedwear
from fedwear.cli import app
from fedwear.config import METRICS
from fedwear.report.tables import comparison_table
from fedwear.summary import aggregate_metrics
from tests.helpers import tiny_config

CHROMIUM = Path("/usr/bin/chromium")
METHODS, SEEDS = ("fedavg", "local"), (0, 1)


class Page(HTMLParser):
    """The images (``data-file`` -> data URI) and table numbers (``data-key`` -> attributes,
    text) of a report page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: dict[str, str] = {}
        self.numbers: dict[str, dict] = {}
        self._open: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "img":
            assert a["data-file"] not in self.images, f"{a['data-file']} embedded twice"
            self.images[a["data-file"]] = a["src"]
        if tag == "span" and "data-key" in a:
            self.numbers[a["data-key"]] = {"value": a["data-value"], "text": ""}
            self._open = a["data-key"]

    def handle_data(self, data: str) -> None:
        if self._open:
            self.numbers[self._open]["text"] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self._open = None


def report(path: Path, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, ["report", str(path), *args])
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run evaluating two views (fewer figures to draw; the comparison has all four) on a
    Dirichlet partition, so clients differ in size and weighted and plain means differ."""
    out = tmp_path_factory.mktemp("report") / "run"
    cfg = tiny_config(**{"evaluation.views": "[personalized,new_clients]",
                         "dataset.partition": "dirichlet", "dataset.num_clients": 6})
    fedwear.run(cfg, out)
    return out


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory) -> Path:
    """What ``fedwear compare --methods fedavg,local --seeds 0,1`` writes."""
    root = tmp_path_factory.mktemp("report") / "cmp"
    summaries: dict[str, list[dict]] = {}
    for method in METHODS:
        for seed in SEEDS:
            res = fedwear.run(tiny_config(method=method, seed=seed), root / f"{method}-s{seed}")
            summaries.setdefault(method, []).append(res.summary)
    md, frame = comparison_table(summaries, "final", tiny_config())
    (root / "table.md").write_text(md + "\n")
    frame.to_csv(root / "table.csv", index=False)
    return root


@pytest.fixture(scope="module")
def run_page(run_dir) -> Path:
    code, out, err = report(run_dir)
    assert code == 0, err
    index = run_dir / "report" / "index.html"
    assert out.strip().splitlines()[-1] == str(index)
    return index


@pytest.fixture(scope="module")
def compare_page(compare_dir, tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("out") / "page"
    code, out, err = report(compare_dir, "--out", str(out_dir))
    assert code == 0, err
    assert out.strip().splitlines()[-1] == str(out_dir / "index.html")
    return out_dir / "index.html"


def assert_images_embedded(index: Path) -> Page:
    page = Page(index.read_text())
    pngs = {p.name: p.read_bytes() for p in index.parent.glob("*.png")}
    assert pngs
    assert sorted(page.images) == sorted(pngs)
    for name, src in page.images.items():
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix), name
        assert base64.b64decode(src[len(prefix):]) == pngs[name], name
    return page


def assert_run_numbers(page: Page, summary: dict, prefix: str = "") -> None:
    """Every final/best number of summary.json is in the page with its value and its text."""
    checked = 0
    for sel in ("final", "best"):
        for view, vals in summary[sel].items():
            for metric, weighted in vals.items():
                stats = summary[f"{sel}_stats"][view][metric]
                key = f"{prefix}{sel}.{view}.{metric}"
                pairs = (("weighted", weighted), ("mean", stats["mean"]), ("std", stats["std"]))
                for k, v in pairs:
                    if v is None:  # NaN in summary.json: "n/a" in the page
                        assert page.numbers.get(f"{key}.{k}", {"value": ""})["value"] == ""
                    else:
                        num = page.numbers[f"{key}.{k}"]
                        assert float(num["value"]) == v, (key, k)
                        assert num["text"] == f"{100 * v:.2f}", (key, k)
                    checked += 1
    assert checked == 2 * 3 * sum(len(v) for v in summary["final"].values())


def test_run_report_embeds_every_png(run_page):
    page = assert_images_embedded(run_page)
    names = set(page.images)
    views = ("personalized", "new_clients")
    assert {f"curve-{v}-{m}.png" for v in views for m in METRICS} <= names
    assert {f"clients-{m}.png" for m in METRICS} <= names
    assert {"bytes_up.png", "bytes_down.png", "train_loss.png", "wall_time.png"} <= names


def test_run_report_table_equals_summary(run_dir, run_page):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert_run_numbers(Page(run_page.read_text()), summary)


def test_captions_say_what_is_shown(run_page, compare_page):
    run_text, cmp_text = run_page.read_text(), compare_page.read_text()
    assert run_text.count("<figcaption>") == len(list(run_page.parent.glob("*.png")))
    assert "sample-weighted mean over clients" in run_text and "test split" in run_text
    assert "population std over clients (ddof=0)" in run_text
    assert "min..max over seeds" in cmp_text and "population std over seeds (ddof=0)" in cmp_text
    assert "lowest seed of each method" in cmp_text


def test_table_captions(run_dir, compare_dir):
    """tables.py says what its numbers are (`fedwear run` and `fedwear compare` print them)."""
    from fedwear.report.tables import summary_table

    caption = summary_table(json.loads((run_dir / "summary.json").read_text())).splitlines()[0]
    assert "test split" in caption and "sample-weighted mean over clients" in caption
    md = (compare_dir / "table.md").read_text().splitlines()[0]
    assert "population std (ddof=0)" in md and "per-seed means over seeds [0, 1]" in md


def test_comparison_report(compare_dir, compare_page):
    page = assert_images_embedded(compare_page)
    # the page says how to make it again: the command line, with --out
    made_by = f"made by <code>fedwear report {compare_dir} --out {compare_page.parent}</code>"
    assert made_by in compare_page.read_text()
    summaries = {m: [json.loads((compare_dir / f"{m}-s{s}" / "summary.json").read_text())
                     for s in SEEDS] for m in METHODS}
    for method, runs in summaries.items():
        for seed, summary in zip(SEEDS, runs, strict=True):
            assert_run_numbers(page, summary, prefix=f"{method}-s{seed}/")
    table = pd.read_csv(compare_dir / "table.csv")
    checked = 0
    for sel in ("final", "best"):
        for method, runs in summaries.items():
            for view in runs[0][sel]:
                for metric in METRICS:
                    vals = np.array([s[sel][view][metric] for s in runs], dtype=float)
                    vals = vals[~np.isnan(vals)]
                    key = f"{sel}.{method}.{view}.{metric}"
                    assert float(page.numbers[key + ".mean"]["value"]) == vals.mean()
                    assert float(page.numbers[key + ".std"]["value"]) == vals.std(ddof=0)
                    if sel == "final":  # the same cells as `fedwear compare`'s table.csv
                        row = table[(table.method == method) & (table.view == view)
                                    & (table.metric == metric)]
                        assert page.numbers[key + ".mean"]["text"] == f"{row['mean'].item():.2f}"
                        assert page.numbers[key + ".std"]["text"] == f"{row['std'].item():.2f}"
                    checked += 1
    assert checked > 40
    # all methods on one figure: the curve legend needs both methods' runs
    curve = compare_page.read_text().split('id="curve-personalized-accuracy.png"')[1]
    assert "fedavg: seeds 0, 1; local: seeds 0, 1" in curve.split("</figure>")[0]


def test_any_numeric_column_is_a_metric(run_dir, tmp_path):
    """A metrics.csv with regression metrics only (mse, mae) gets their curves and bars."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("report"))
    m = pd.read_csv(run / "metrics.csv")
    m = m.assign(mse=(1 - m["accuracy"]) ** 2, mae=1 - m["accuracy"]).drop(columns=list(METRICS))
    m[m["view"] == "personalized"].to_csv(run / "metrics.csv", index=False)
    code, _, err = report(run)
    assert code == 0, err
    pngs = {p.name for p in (run / "report").glob("*.png")}
    assert {"curve-personalized-mse.png", "curve-personalized-mae.png", "clients-mse.png"} <= pngs
    assert not any("accuracy" in p or "new_clients" in p for p in pngs)


def test_aggregate_metrics_takes_metrics_from_the_frame(run_dir):
    m = pd.read_csv(run_dir / "metrics.csv")
    base = aggregate_metrics(m)
    assert list(dict.fromkeys(base["metric"])) == list(METRICS)
    extra = aggregate_metrics(m.assign(mae=1 - m["accuracy"]))
    assert list(dict.fromkeys(extra["metric"])) == [*METRICS, "mae"]
    pd.testing.assert_frame_equal(extra[extra.metric != "mae"].reset_index(drop=True), base)


def one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


def test_not_a_run_dir(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = report(tmp_path)
    one_line_error(code, err, str(tmp_path), "neither a run directory", "fedwear run")
    one_line_error(*report(tmp_path / "missing")[::2], "does not exist")


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("metrics.csv", None, "metrics.csv is missing"),
    ("metrics.csv", "round,client\n1,\"a\n", "metrics.csv is not a readable CSV"),
    ("metrics.csv", "", "metrics.csv is not a readable CSV"),
    ("rounds.csv", "round,n_clients\n1,3\n", "rounds.csv lacks the column(s) bytes_down"),
    ("summary.json", "{not json", "summary.json is not readable JSON"),
])
def test_broken_run_dir(run_dir, tmp_path, name, content, needle):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("report"))
    if content is None:
        (run / name).unlink()
    else:
        (run / name).write_text(content)
    code, _, err = report(run)
    one_line_error(code, err, str(run / name), needle)


def test_unfinished_run_is_reported_as_far_as_it_got(run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("report"))
    (run / "summary.json").unlink()
    for name in ("metrics.csv", "rounds.csv", "timing.csv"):  # stopped after round 2 of 3
        frame = pd.read_csv(run / name)
        frame[frame["round"] <= 2].to_csv(run / name, index=False)
    code, _, err = report(run)
    assert code == 0, err
    page = (run / "report" / "index.html").read_text()
    assert "unfinished: stopped at round 2 of 3" in page and "no summary.json: the run is unfinished" in page
    (run / "config.yaml").unlink()  # nothing to rebuild the summary from
    one_line_error(*report(run)[::2], str(run / "summary.json"), "summary.json is missing")


def text_of(page: Path) -> str:
    """The page's text, tags and embedded images left out."""
    body = re.sub(r'src="data:[^"]*"', "", page.read_text().split("</script>")[-1])
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_run_stopped_before_its_first_evaluation_is_reported(tmp_path, kind):
    """metrics.csv holds its header only: the tables and per-round figures say no round was
    evaluated yet (with the task's own metrics), the rounds, bytes and times it has are drawn."""
    from fedwear.api import run
    from tests.helpers import tiny_regression_config

    make = tiny_config if kind == "classification" else tiny_regression_config
    out = tmp_path / "run"
    run(make(rounds=6, **{"evaluation.every": 4}), out, until=2)
    assert len(pd.read_csv(out / "metrics.csv")) == 0 and len(pd.read_csv(out / "rounds.csv")) == 2
    code, _, err = report(out)
    assert code == 0, err
    index = out / "report" / "index.html"
    text = text_of(index)
    assert "(unfinished: stopped at round 2 of 6)" in text
    assert "unfinished : stopped at round 2 of 6 (no summary.json); run.log: end:" in text
    assert "no round evaluated yet; 0.0" in text  # the bytes it sent are there
    said = "No round evaluated yet (the run stopped at round 2 of 6): metrics.csv holds no rows, so there is no "
    metrics = "accuracy, macro-F1, AUC" if kind == "classification" else "MSE (bpm²), MAE (bpm), MAPE (%)"
    assert text.count(said + metrics + " to show.") == 3  # the summary, the curves, the per-client bars
    assert "mean ± std" not in text and "<table" not in index.read_text()  # no empty table
    assert "is None" not in text  # a figure from the checkpoint says no round was evaluated
    drawn = {f for f in Page(index.read_text()).images if not f.startswith("forecast-")}  # from the checkpoint
    assert sorted(drawn) == ["bytes_down.png", "bytes_up.png", "train_loss.png", "wall_time.png"]
    # stopped inside round 1: nothing but the headers yet
    for name in ("rounds.csv", "timing.csv"):
        (out / name).write_text((out / name).read_text().splitlines()[0] + "\n")
    code, _, err = report(out)
    assert code == 0, err
    assert "(unfinished: stopped before round 1 of 6 ended)" in text_of(index)


def test_stopped_run_is_reported_up_to_its_last_round(tmp_path, compare_dir):
    """Stopped at round 5 of 6 after evaluations at rounds 2 and 4, killed while writing round 6
    (torn last lines): reported up to round 5, numbers of round 4, labelled as stopped there; in
    a comparison beside a run that evaluated nothing yet, that run's cells are n/a."""
    from fedwear.api import run

    out = tmp_path / "cmp" / "fedavg-s0"
    run(tiny_config(rounds=6, **{"evaluation.every": 2}), out, until=5)
    with (out / "rounds.csv").open("a") as f:
        f.write("6,3,s01;s0")
    with (out / "metrics.csv").open("a") as f:
        f.write("6,s01,personalized,te")
    code, _, err = report(out)
    assert code == 0, err
    page = Page((out / "report" / "index.html").read_text())
    text = text_of(out / "report" / "index.html")
    assert "(unfinished: stopped at round 5 of 6)" in text and "final (round 4)" in text
    assert "final: its last evaluated round so far" in text
    want = pd.read_csv(out / "metrics.csv").iloc[:-1]
    final = want[(want["round"] == 4) & (want["view"] == "personalized") & (want["split"] == "test")]
    acc = np.average(final["accuracy"], weights=final["n"])
    assert float(page.numbers["final.personalized.accuracy.weighted"]["value"]) == pytest.approx(acc, rel=1e-12)
    assert "curve-personalized-accuracy.png" in page.images
    # a comparison: this run and one that evaluated no round yet
    early = tmp_path / "cmp" / "local-s0"
    run(tiny_config(method="local", rounds=6, **{"evaluation.every": 4}), early, until=1)
    code, _, err = report(tmp_path / "cmp")
    assert code == 0, err
    text = text_of(tmp_path / "cmp" / "report" / "index.html")
    assert ("Read as far as they got (no summary.json yet): fedavg seed 0 (unfinished: stopped at round 5 of 6); "
            "local seed 0 (unfinished: stopped at round 1 of 6), no round evaluated yet.") in text
    assert "No round evaluated yet (the run stopped at round 1 of 6)" in text  # its own table
    # only local's runs: nothing evaluated anywhere
    shutil.rmtree(out)
    code, _, err = report(tmp_path / "cmp")
    assert code == 0, err
    assert text_of(tmp_path / "cmp" / "report" / "index.html").count("No round evaluated yet") >= 4


def test_broken_run_in_comparison(compare_dir, tmp_path):
    cmp = tmp_path / "cmp"
    shutil.copytree(compare_dir, cmp, ignore=shutil.ignore_patterns("report"))
    (cmp / "local-s1" / "timing.csv").write_text("garbage\n")
    code, _, err = report(cmp)
    one_line_error(code, err, str(cmp / "local-s1" / "timing.csv"), "lacks the column(s)")


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=5000",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_page_renders_in_chromium(compare_page, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("chromium not installed: apt-get install chromium")
    # the page alone, away from its PNG files, must still show every image
    alone = tmp_path / "alone" / "index.html"
    alone.parent.mkdir()
    shutil.copy(compare_page, alone)
    res = chromium("--dump-dom", alone.as_uri(), tmp=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    found = re.search(r'<body[^>]*data-images-ok="(\d+)/(\d+)"', res.stdout)
    assert found, res.stdout[:500]
    n_png = len(list(compare_page.parent.glob("*.png")))
    assert found.groups() == (str(n_png), str(n_png))
    shot = tmp_path / "page.png"
    res = chromium(f"--screenshot={shot}", "--window-size=1400,3000", alone.as_uri(), tmp=tmp_path)
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert shot.stat().st_size > 100_000  # a blank 1400x3000 page is a few kB
    assert shot.read_bytes()[16:24] == (1400).to_bytes(4, "big") + (3000).to_bytes(4, "big")


def test_long_lines_that_coincide_keep_staggered_markers():
    """300-round curves: each line keeps about 15 markers, at other rounds than the line it is
    drawn under, so a method whose curve equals another's (FedHome's FedAvg rounds) still shows."""
    from fedwear.report.plots import _new_figure, _thin_markers

    ax = _new_figure(4, 3).add_subplot()
    x = np.arange(301)
    for marker in ("o", "s"):
        ax.plot(x, np.sin(x / 9), marker=marker)
    ax.plot(x[:30], x[:30] / 30, marker="D")  # a short line keeps every marker
    _thin_markers(ax)
    first, second, short = (line.get_markevery() for line in ax.get_lines())
    assert 13 <= len(first) <= 16 and 13 <= len(second) <= 16
    assert not set(first) & set(second)
    assert short is None


def test_variants_of_one_method_stay_apart(compare_dir, tmp_path):
    """A folder holding a method and its variant (as `reproduce` writes: pcfedh-s0 beside
    pcfedh-no_cre-s0) groups them by folder name, not by method: never as seeds of one row."""
    from fedwear.report.rundir import load_comparison

    root = tmp_path / "cmp"
    shutil.copytree(compare_dir / "fedavg-s0", root / "fedavg-s0")
    shutil.copytree(compare_dir / "fedavg-s0", root / "fedavg-no_momentum-s0")
    shutil.copytree(compare_dir / "fedavg-s1", root / "my-own-run")  # not <name>-s<seed>: its method
    cmp = load_comparison(root, sorted(p for p in root.iterdir()))
    assert {k: len(v) for k, v in cmp.runs.items()} == {"fedavg": 2, "fedavg-no_momentum": 1}
    assert [r.label for r in cmp.runs["fedavg"]] == ["fedavg seed 0", "fedavg seed 1"]
