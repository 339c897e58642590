"""``fedwear report``: PNGs plus one self-contained HTML page whose numbers match summary.json."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from typer.testing import CliRunner

import fedwear
from fedwear.cli import app
from fedwear.config import METRICS
from fedwear.report.tables import comparison_table
from fedwear.summary import aggregate_metrics
from tests.helpers import figure_texts, tiny_config

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


@pytest.mark.slow
def test_run_report_embeds_every_png(run_page):
    page = assert_images_embedded(run_page)
    names = set(page.images)
    views = ("personalized", "new_clients")
    assert {"headline.png", "curves.png", "cost.png"} <= names
    assert {f"distribution-{m}.png" for m in METRICS} <= names
    assert {f"{kind}-{v}.png" for kind in ("confusion", "f1") for v in views} <= names
    assert {"bytes_up.png", "bytes_down.png", "train_loss.png", "wall_time.png"} <= names
    text = run_page.read_text()  # the headline comes first, above the tables
    assert text.index('id="headline.png"') < text.index("<table") < text.index('id="curves.png"')


@pytest.mark.slow
def test_run_report_table_equals_summary(run_dir, run_page):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert_run_numbers(Page(run_page.read_text()), summary)


@pytest.mark.slow
def test_captions_say_what_is_shown(run_page, compare_page):
    run_text, cmp_text = run_page.read_text(), compare_page.read_text()
    assert run_text.count("<figcaption>") == len(list(run_page.parent.glob("*.png")))
    assert "sample-weighted mean over clients" in run_text and "test split" in run_text
    assert "population std over clients (ddof=0)" in run_text
    assert "min..max over seeds" in cmp_text and "population std over seeds (ddof=0)" in cmp_text
    # the per-client boxes cover every seed's clients, and say so
    dist = captions(compare_page)["distribution-accuracy.png"]
    assert "each point one client of one seed" in dist and "fedavg: seeds 0, 1; local: seeds 0, 1" in dist


def test_table_captions(run_dir, compare_dir):
    """tables.py says what its numbers are (`fedwear run` and `fedwear compare` print them)."""
    from fedwear.report.tables import summary_table

    caption = summary_table(json.loads((run_dir / "summary.json").read_text())).splitlines()[0]
    assert "test split" in caption and "sample-weighted mean over clients" in caption
    md = (compare_dir / "table.md").read_text().splitlines()[0]
    assert "population std (ddof=0)" in md and "per-seed means over seeds [0, 1]" in md


@pytest.mark.slow
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
    assert "fedavg: seeds 0, 1; local: seeds 0, 1" in captions(compare_page)["curves.png"]


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
    assert {"curves.png", "distribution-mse.png", "distribution-mae.png"} <= pngs
    assert not any("accuracy" in p or "new_clients" in p or "confusion" in p for p in pngs)
    text = (run / "report" / "index.html").read_text()
    assert "no confusion.csv" not in text and "Per class" not in text  # no classes: no per-class section


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
@pytest.mark.slow
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


@pytest.mark.slow
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
    assert "curves.png" in page.images
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


def needs_chromium() -> None:
    """Skip without Chromium; fail where it is required (CI sets FEDWEAR_REQUIRE_CHROMIUM=1)."""
    if not CHROMIUM.exists():
        if os.environ.get("FEDWEAR_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"{CHROMIUM} is required here (FEDWEAR_REQUIRE_CHROMIUM=1): apt-get install chromium")
        pytest.skip("chromium not installed: apt-get install chromium")


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=5000",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # after CI's apt-get install of Chromium, which runs beside the fast tests
def test_page_renders_in_chromium(compare_page, tmp_path):
    needs_chromium()
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
    assert_not_blank(shot)


def rendered(index: Path, tmp: Path) -> str:
    """The page's DOM after Chromium loaded it on its own (away from its PNG files), with every
    image loaded, and a screenshot of it that is not blank."""
    alone = tmp / "alone" / "index.html"
    alone.parent.mkdir(parents=True)
    shutil.copy(index, alone)
    dom = chromium("--dump-dom", alone.as_uri(), tmp=tmp)
    assert dom.returncode == 0, dom.stderr[-2000:]
    n_png = len(list(index.parent.glob("*.png")))
    assert f'data-images-ok="{n_png}/{n_png}"' in dom.stdout, dom.stdout[:300]
    shot = tmp / "page.png"
    res = chromium(f"--screenshot={shot}", "--window-size=1400,4000", alone.as_uri(), tmp=tmp)
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert_not_blank(shot)
    return dom.stdout


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


@pytest.mark.slow
def test_seeds_not_alike_are_named(compare_dir, tmp_path):
    """Seeds of one method that ran other settings (seed aside), or that are read at other
    rounds, are named at the top of the page and under the headline: their mean mixes them."""
    from fedwear.api import run
    from fedwear.report.rundir import load, unlike_seeds

    root = tmp_path / "cmp"
    shutil.copytree(compare_dir, root, ignore=shutil.ignore_patterns("report"))
    assert unlike_seeds(load(root).runs) == []  # seeds 0 and 1 of one config: alike
    shutil.rmtree(root / "local-s1")
    run(tiny_config(method="local", seed=1, **{"optimizer.lr": 0.1}), root / "local-s1", until=2)
    unlike = ["local: optimizer.lr: 0.05 (seed 0), 0.1 (seed 1)", "local: read at round 3 (seed 0), 2 (seed 1)"]
    assert unlike_seeds(load(root).runs) == unlike
    code, _, err = report(root)
    assert code == 0, err
    text = text_of(root / "report" / "index.html")
    assert f"seeds not alike (a mean over them mixes these): {'; '.join(unlike)}" in text
    assert captions(root / "report" / "index.html")["headline.png"].endswith(
        f"Seeds not alike, so a bar's mean mixes them: {'; '.join(unlike)}.")


# --- the paper-style figures -----------------------------------------------------------------


def assert_not_blank(png: Path) -> None:
    """A drawn figure: many distinct colours and a good share of non-white pixels."""
    from matplotlib.image import imread

    image = imread(png)[..., :3]
    colours = len(np.unique((image * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    ink = (image < 0.95).any(axis=2).mean()
    assert colours > 30 and ink > 0.03, (png.name, colours, ink)


def share_of(png: Path, colour: str, alpha: float = 1.0) -> float:
    """The share of ``png``'s pixels in ``colour`` drawn with ``alpha`` over white (within 2/255)."""
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread

    want = alpha * np.array(to_rgb(colour)) + (1 - alpha)
    return float((np.abs(imread(png)[..., :3] - want) < 2 / 255).all(axis=2).mean())


@pytest.mark.slow
def test_every_figure_is_drawn(compare_page):
    pngs = sorted(compare_page.parent.glob("*.png"))
    assert {"headline.png", "curves.png", "distribution-accuracy.png", "confusion-personalized.png",
            "confusion-new_clients.png", "f1-personalized.png", "f1-new_clients.png", "cost.png"} <= {p.name for p in pngs}
    for png in pngs:
        assert_not_blank(png)
    from fedwear.report.plots import _palette

    for colour in _palette(2)[:2]:  # each method's bars (fedavg, local; alpha 0.85) fill part of the headline
        assert share_of(compare_page.parent / "headline.png", colour, 0.85) > 0.01, colour


def test_up_to_ten_methods_get_tableau_s_colour_blind_safe_colours():
    from matplotlib import style

    from fedwear.report.plots import colors

    safe = style.library["tableau-colorblind10"]["axes.prop_cycle"].by_key()["color"]
    assert list(colors({f"m{i}": [] for i in range(10)}).values()) == safe
    assert len(set(map(str, colors({f"m{i}": [] for i in range(14)}).values()))) == 14  # more: still one each


captions = figure_texts


def test_views_that_are_one_model_are_drawn_once(compare_dir, compare_page):
    """FedAvg's personalized and global views are the same model (identical rows); Local has no
    global view, and its personalized and generalization views differ."""
    from fedwear.report.plots import same_model_views
    from fedwear.report.rundir import load

    cmp = load(compare_dir)
    assert same_model_views(cmp.runs["fedavg"]) == {"global": "personalized"}
    assert same_model_views(cmp.runs["local"]) == {}
    caps = captions(compare_page)
    assert "fedavg: personalized = global" in caps["curves.png"]
    assert "fedavg: personalized = global" in caps["headline.png"]
    assert "No paper number: the folder 'cmp' is not the run folder" in caps["headline.png"]


def test_axes_are_honest():
    """No zoom into a tiny difference, bars from 0, errors from 0, integer rounds, a flat 0
    line above the axis."""
    from fedwear.report.plots import _new_figure, axis_range, round_axis, set_range, show_zero

    assert axis_range("accuracy", [0.805, 0.815])[:2] == (70.0, 90.0)
    assert axis_range("accuracy", [0.99, 1.0])[:2] == (80.0, 100.0)  # at least 20 points wide
    assert axis_range("accuracy", [0.1, 0.9])[:2] == (0.0, 100.0)
    assert axis_range("accuracy", [0.805, 0.815], bars=True)[:2] == (0.0, 100.0)
    lo, hi, how = axis_range("mse", [2.0, 3.0])
    assert lo == 0.0 and hi == pytest.approx(3.3) and "from 0" in how
    ax = _new_figure(3, 3).add_subplot()
    ax.plot([3], [0.5], marker="o")
    round_axis(ax, [3])
    assert ax.get_xlim() == (2.0, 4.0) and list(ax.get_xticks()) == [3.0]
    set_range(ax, 0.0, 100.0)
    assert ax.get_ylim()[0] < 0 < 100 < ax.get_ylim()[1]  # a line at 0 or 100 stays visible
    ax = _new_figure(3, 3).add_subplot()
    ax.plot([1, 2, 3], [0, 0, 0])
    show_zero(ax)
    assert ax.get_ylim()[0] < 0


@pytest.mark.slow
def test_a_single_evaluated_round_is_a_point(tmp_path):
    fedwear.run(tiny_config(rounds=1), tmp_path / "run")
    code, _, err = report(tmp_path / "run")
    assert code == 0, err
    for png in ("curves.png", "headline.png", "cost.png"):
        assert_not_blank(tmp_path / "run" / "report" / png)


@pytest.mark.slow
def test_single_seed_cells_give_the_value_alone(compare_dir, tmp_path):
    """One seed of a method: its cells give the value alone, never "± 0.00" (nor an "n = 1 seed"
    repeated in every cell: the column header and the seeds column say it once), in the page's
    tables and in `fedwear compare`'s Markdown table."""
    root = tmp_path / "cmp"
    for name in ("fedavg-s0", "fedavg-s1", "local-s0"):
        shutil.copytree(compare_dir / name, root / name, ignore=shutil.ignore_patterns("report"))
    code, _, err = report(root)
    assert code == 0, err
    page = Page((root / "report" / "index.html").read_text())
    text = text_of(root / "report" / "index.html")
    assert "local (1 seed)" in text and "fedavg (2 seeds, reference)" in text
    for sel in ("final", "best"):
        for view in ("personalized", "new_clients"):
            key = f"{sel}.local.{view}.accuracy"
            assert key + ".mean" in page.numbers and key + ".std" not in page.numbers
            assert f"{sel}.fedavg.{view}.accuracy.std" in page.numbers
    cell = re.search(r'data-key="final\.local\.personalized\.accuracy\.mean"[^>]*>[^<]*</span>([^<]*)</td>',
                     (root / "report" / "index.html").read_text())
    assert cell and cell.group(1) == ""  # the value alone: the header says "local (1 seed)"
    assert "n = 2 seeds (fedavg), 1 seed (local)" in captions(root / "report" / "index.html")["headline.png"]
    summaries = {m: [json.loads((root / f"{m}-s{s}" / "summary.json").read_text()) for s in seeds]
                 for m, seeds in (("fedavg", (0, 1)), ("local", (0,)))}
    md, frame = comparison_table(summaries, "final", tiny_config())
    local = next(line for line in md.splitlines() if line.startswith("| local |"))
    fedavg = next(line for line in md.splitlines() if line.startswith("| fedavg |"))
    assert "±" not in local and "seed" not in local and local.count("n/a") == 3  # no global view
    assert fedavg.count("±") == 12 and "seed" not in fedavg
    assert "(a value without ± is one seed's)" in md
    value = summaries["local"][0]["final"]["personalized"]["accuracy"]
    final = summaries["local"][0]["final_round"]
    assert f"| local | 0 | {final} | {100 * value:.2f} |" in md  # every row: its seeds and round
    assert fedavg.startswith(f"| fedavg | 0, 1 | {final} |")
    best = [s["best_round"] for s in summaries["fedavg"]]
    best_md, _ = comparison_table(summaries, "best", tiny_config())
    shown = best[0] if best[0] == best[1] else f"{best[0]}, {best[1]}"
    assert f"| fedavg | 0, 1 | {shown} |" in best_md


@pytest.mark.slow
def test_headline_marks_the_reference_and_the_papers_numbers(compare_dir, tmp_path):
    """A folder that is a registered table's run folder (`fedwear reproduce protohar:table2`
    writes runs/protohar-table2) on that table's dataset gets the paper's numbers; any other
    folder none, and its caption says why."""
    from fedwear.commands import paper_numbers

    plain = paper_numbers(compare_dir)
    assert not plain.values and "is not the run folder of a registered paper table" in plain.none
    root = tmp_path / "protohar-table2"
    for name in ("fedavg-s0", "fedavg-s1", "local-s0", "local-s1"):
        shutil.copytree(compare_dir / name, root / name, ignore=shutil.ignore_patterns("report"))
    wrong = paper_numbers(root)  # synthetic data: not the paper's USC-HAD
    assert not wrong.values and "runs on usc_had, these runs on synthetic" in wrong.none
    for cfg in root.glob("*/config.yaml"):
        cfg.write_text(cfg.read_text().replace("name: synthetic\n", "name: usc_had\n"))
    found = paper_numbers(root)
    assert found.values["fedavg"][("personalized", "accuracy")] == pytest.approx(0.70812)
    assert found.values["local"][("personalized", "macro_f1")] == pytest.approx(0.50063)
    assert found.values["protohar-rp0.1"][("personalized", "accuracy")] == pytest.approx(0.80716)  # Table IV
    assert "Table II" in found.sources["protohar"] and "Table IV" in found.sources["protohar-rp0.1"]
    assert paper_numbers(root / "fedavg-s0").values == found.values  # a run of that folder
    code, _, err = report(root, "--reference", "local")
    assert code == 0, err
    caps = captions(root / "report" / "index.html")
    head = caps["headline.png"]
    assert "Reference: local" in head and "n = 2 seeds per method" in head
    assert "fedavg, local: Cheng et al., IEEE JBHI 2023, Table II" in head
    assert "matched by the folder name 'protohar-table2'" in head
    assert "local (2 seeds, reference)" in text_of(root / "report" / "index.html")
    one_line_error(*report(root, "--reference", "moon")[::2], "--reference 'moon' is not a method")


def test_budgeted_paper_numbers_go_to_their_views(tmp_path):
    """Meta-HAR's prose numbers (meta-train, meta-test accuracy of metahar@n3) are the
    personalized@n3 and new_clients@n3 views."""
    from fedwear.commands import paper_numbers

    root = tmp_path / "metahar-table1-usc_had"
    (root / "metahar-s0").mkdir(parents=True)
    (root / "metahar-s0" / "config.yaml").write_text("dataset:\n  name: usc_had\n")
    got = paper_numbers(root)
    assert got.values == {"metahar": {("personalized@n3", "accuracy"): pytest.approx(0.9379),
                                      ("new_clients@n3", "accuracy"): pytest.approx(0.9107)}}
    fedali = tmp_path / "fedali-uci_hapt"
    (fedali / "fedavg-s1").mkdir(parents=True)
    (fedali / "fedavg-s1" / "config.yaml").write_text("dataset:\n  name: uci_hapt\n")
    assert "fedali:table1 reports HHAR, RealWorld, not the data these runs use" in paper_numbers(fedali).none


def test_a_run_folder_older_than_confusion_csv_still_reports(run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("report"))
    (run / "confusion.csv").unlink()
    code, _, err = report(run)
    assert code == 0, err
    text = text_of(run / "report" / "index.html")
    assert "no confusion.csv (run made before fedwear recorded it): fedavg seed 0" in text
    names = {p.name for p in (run / "report").glob("*.png")}
    assert "headline.png" in names and not any(n.startswith(("confusion-", "f1-")) for n in names)


@pytest.mark.slow
def test_runs_without_confusion_csv_are_named_beside_the_others(compare_dir, tmp_path):
    root = tmp_path / "cmp"
    shutil.copytree(compare_dir, root, ignore=shutil.ignore_patterns("report"))
    (root / "local-s1" / "confusion.csv").unlink()
    code, _, err = report(root)
    assert code == 0, err
    caps = captions(root / "report" / "index.html")
    for name in ("confusion-personalized.png", "f1-new_clients.png"):
        assert "local: personalized, seed 0 (round 3)" in caps[name] or "local: new_clients, seed 0 (round 3)" in caps[name]
        assert "Left out: no confusion.csv (run made before fedwear recorded it): local seed 1" in caps[name]


@pytest.mark.slow
def test_quickstart_comparison_renders_as_a_paper_figure_set(tmp_path):
    """`fedwear compare` of the quickstart config (3 of its methods x 2 seeds on the bundled UCI
    HAPT subset, 2 rounds) and its report in Chromium: every figure there and drawn; then the
    same with one seed per method, whose columns say "1 seed" once and whose cells have no ±."""
    needs_chromium()
    cmp = tmp_path / "qs"
    res = CliRunner().invoke(app, [
        "compare", "configs/quickstart.yaml", "--methods", "fedavg,local,centralized", "--seeds", "0,1",
        "--set", "rounds=2", "--set", "evaluation.every=1", "--set", "evaluation.adapt_epochs=1",
        "--set", f"dataset.cache_dir={tmp_path / 'cache'}", "--out", str(cmp), "--quiet"])
    assert res.exit_code == 0, res.stderr
    code, _, err = report(cmp)
    assert code == 0, err
    index = cmp / "report" / "index.html"
    figures = {"headline.png", "curves.png", "distribution-accuracy.png", "confusion-personalized.png",
               "confusion-new_clients.png", "f1-personalized.png", "f1-new_clients.png", "cost.png"}
    pngs = {p.name: p for p in index.parent.glob("*.png")}
    assert figures <= set(pngs)
    for png in pngs.values():
        assert_not_blank(png)
    dom = rendered(index, tmp_path / "three")
    assert "n = 2 seeds per method" in dom and "Reference: fedavg" in dom
    assert "fedavg, centralized: personalized = global" in html.unescape(dom)
    caps = captions(index)
    assert "fedavg: personalized, seeds 0, 1 (round 2)" in caps["confusion-personalized.png"]
    assert "local: new_clients, seeds 0, 1 (round 2)" in caps["f1-new_clients.png"]
    # one seed per method
    one = tmp_path / "one"
    for m in ("fedavg", "local", "centralized"):
        shutil.copytree(cmp / f"{m}-s0", one / f"{m}-s0", ignore=shutil.ignore_patterns("report"))
    code, _, err = report(one)
    assert code == 0, err
    dom = rendered(one / "report" / "index.html", tmp_path / "single")
    assert "fedavg (1 seed)" in dom and "n = 1 seed per method" in dom
    cells = re.findall(r"<td>(.*?)</td>", dom.split("<h3>final round</h3>")[1].split("</table>")[0])
    assert cells and all("±" not in c for c in cells)


def test_a_comparison_row_names_the_round_of_each_seed():
    from fedwear.report.tables import rounds_read

    runs = [{"final_round": 30, "best_round": 12}, {"final_round": 30, "best_round": 20}]
    assert rounds_read(runs, "final") == "30"  # one round for all seeds: said once
    assert rounds_read(runs, "best") == "12, 20"


@pytest.mark.parametrize("fmt", ["pdf", "svg"])
@pytest.mark.slow
def test_format_writes_each_figure_also_as_a_vector_file(run_dir, tmp_path, fmt):
    """For a paper: every PNG of the page has a vector twin (paths and text, not a bitmap), the
    PNGs are at 300 dpi, and a later --format png report removes the twins it no longer makes."""
    from PIL import Image

    out = tmp_path / "page"
    code, _, err = report(run_dir, "--out", str(out), "--format", fmt)
    assert code == 0, err
    pngs = sorted(out.glob("*.png"))
    assert pngs and all(p.with_suffix(f".{fmt}").is_file() for p in pngs)
    curves = (out / f"curves.{fmt}").read_bytes()
    if fmt == "pdf":
        assert curves.startswith(b"%PDF") and b"/Subtype /Image" not in curves  # drawn, not a picture
    else:
        assert b"<path" in curves and b"<image" not in curves
    assert round(Image.open(out / "curves.png").info["dpi"][0]) == 300
    code, _, err = report(run_dir, "--out", str(out))
    assert code == 0, err
    assert not list(out.glob(f"*.{fmt}"))


def test_an_unknown_format_is_one_line(run_dir, tmp_path):
    code, _, err = report(run_dir, "--out", str(tmp_path / "page"), "--format", "jpg")
    assert code == 2 and "--format 'jpg': use one of png, pdf, svg" in err


@pytest.mark.parametrize(("rounds", "ticks"), [
    ([0, 5, 10, 15], [0, 5, 10, 15]),  # matplotlib's own locator put them at 0, 3, 6, 9, 12, 15
    (list(range(0, 301, 10)), list(range(0, 301, 50))),  # 31 points: every 50th round
    (list(range(1, 301)), list(range(50, 301, 50))),  # every round (the cost figures)
    ([*range(0, 100, 10), 97], list(range(0, 100, 20))),  # a last round off the grid
    ([7], [7]),
])
def test_round_ticks_sit_on_the_points(rounds, ticks):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from fedwear.report.plots import round_axis

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot(rounds, np.zeros(len(rounds)), "o")
    round_axis(ax, rounds)
    assert [int(t) for t in ax.get_xticks()] == ticks
    assert set(ax.get_xticks()) <= set(rounds)


# --- figures a paper can use ---------------------------------------------------------------------
HAPT_NAMES = ["WALKING", "WALKING_UPSTAIRS", "WALKING_DOWNSTAIRS", "SITTING", "STANDING", "LAYING"]


def drawn_figures(monkeypatch, path: Path, *args: str) -> dict[str, object]:
    """The report of ``path`` (beside it), keeping each figure (by file name) as it is saved."""
    from matplotlib.figure import Figure

    figures, save = {}, Figure.savefig

    def keep(fig, fname, *a, **kw):
        figures[Path(fname).name] = fig
        return save(fig, fname, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", keep)
    code, _, err = report(path, "--out", str(path.parent / f"{path.name}-page"), *args)
    assert code == 0, err
    return {k: v for k, v in figures.items() if k.endswith(".png")}


@pytest.fixture(scope="module")
def hapt_compare(tmp_path_factory) -> Path:
    """FedAvg and Local on the bundled UCI HAPT subset with all 12 classes (long names: flat,
    they would touch even across a double column), one round, 2 seeds of FedAvg."""
    from fedwear.config import load_config

    root = tmp_path_factory.mktemp("hapt") / "cmp"
    for method, seed in (("fedavg", 0), ("fedavg", 1), ("local", 0)):
        cfg = load_config("configs/quickstart.yaml", [f"method={method}", f"seed={seed}", "rounds=1",
                                                       "evaluation.every=1", "evaluation.adapt_epochs=1",
                                                       "dataset.classes=null", f"dataset.cache_dir={root.parent / 'cache'}"])
        fedwear.run(cfg, root / f"{method}-s{seed}")
    return root


def test_no_tick_labels_overlap_in_any_figure(monkeypatch, hapt_compare):
    """Every figure of a comparison and of a single run on UCI HAPT (whose class names are long)
    at its paper width: no two tick labels of an axis touch (measured by matplotlib's renderer)."""
    from fedwear.report.style import DOUBLE_COLUMN, SINGLE_COLUMN, overlapping_labels

    for path in (hapt_compare, hapt_compare / "fedavg-s0"):
        figures = drawn_figures(monkeypatch, path)
        assert {"f1-personalized.png", "headline.png", "distribution-accuracy.png"} <= set(figures)
        for name, fig in figures.items():
            assert fig.get_figwidth() in (SINGLE_COLUMN, DOUBLE_COLUMN), name
            assert overlapping_labels(fig) == [], name
        labels = [t.get_text() for t in figures["f1-personalized.png"].axes[0].get_xticklabels()]
        assert labels[:6] == HAPT_NAMES and len(labels) == 12


def test_long_labels_are_turned_only_when_they_would_touch():
    """Drawn flat in a single column, UCI HAPT's six names touch (the check sees it); turned by
    fit_tick_labels they do not. Four short names stay flat."""
    from fedwear.report.plots import _new_figure
    from fedwear.report.style import fit_tick_labels, overlapping_labels, paper_style

    with paper_style():
        for names, turned in ((HAPT_NAMES, True), (["a", "b", "c", "d"], False)):
            fig = _new_figure(3.5, 3.0)
            ax = fig.add_subplot()
            ax.set_xticks(range(len(names)), names)
            fig.canvas.draw()
            assert bool(overlapping_labels(fig)) == turned
            fit_tick_labels(ax)
            fig.canvas.draw()
            assert overlapping_labels(fig) == []
            assert {t.get_rotation() for t in ax.get_xticklabels()} == ({45.0} if turned else {0.0})


def test_captions_are_short_and_the_notes_are_in_one_block(run_page, compare_page):
    """Every caption within two lines (MAX_CAPTION characters); the reading notes of every
    figure in the page's one "How to read" block, each linked to its figure."""
    from fedwear.report.plots import MAX_CAPTION

    for page in (run_page, compare_page):
        text = html.unescape(page.read_text())
        figures = re.findall(r"<figcaption><b>([^<]+)</b>: (.*?)</figcaption>", text)
        assert figures and all(len(caption) <= MAX_CAPTION for _, caption in figures)
        assert text.count('<details class="how">') == 1
        notes = re.findall(r'<dt><a href="#([^"]+)">', text)
        assert sorted(notes) == sorted(file for file, _ in figures)


def test_headlines_draw_coinciding_views_once_and_a_run_s_clients(monkeypatch, compare_dir):
    """A comparison's headline: FedAvg's global view is its personalized one, and Local has no
    global view, so no global group; the personalized group says so. A single run's headline:
    per view, its clients as points and its mean over them as a line with the value above."""
    figures = drawn_figures(monkeypatch, compare_dir)
    ticks = [t.get_text() for t in figures["headline.png"].axes[0].get_xticklabels()]
    assert ticks == ["personalized\n(= global for fedavg)", "generalization", "new_clients"]
    run = compare_dir / "fedavg-s0"
    figures = drawn_figures(monkeypatch, run)
    ax = figures["headline.png"].axes[0]
    summary = json.loads((run / "summary.json").read_text())
    metrics = pd.read_csv(run / "metrics.csv")
    final = metrics[(metrics["round"] == summary["final_round"]) & (metrics["split"] == "test")]
    views = ["personalized", "generalization", "new_clients"]
    counts = [int((final["view"] == v).sum()) for v in views]
    names = ["personalized\n(= global for fedavg)", "generalization", "new_clients"]
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"{v}\nn = {k}" for v, k in zip(names, counts, strict=True)]
    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert sum(len(c.get_offsets()) for c in points) == sum(counts)
    means = [float(t.get_text()) for t in ax.texts]
    assert means == pytest.approx([100 * summary["final"][v]["accuracy"] for v in views], abs=0.005)


@pytest.mark.slow
def test_a_comparison_of_many_methods_on_their_own_views_gets_its_report(tmp_path):
    """Meta-HAR's merged comparison: each method evaluated on its own view (budgets), whose list
    once made the cost figure's caption longer than a caption may be."""
    from pathlib import Path

    from fedwear.commands import report

    folder = Path(__file__).resolve().parents[1] / "results" / "runs" / "metahar-merged"
    assert "cost.png" in report(folder, tmp_path / "report").read_text()
