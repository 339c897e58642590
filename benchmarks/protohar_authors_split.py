"""fedwear on the authors' own USC-HAD split: tells implementation from data in Table II gaps.

    python benchmarks/protohar_authors_split.py --authors /tmp/protohar_code \
        --method fedavg --seed 0 --out runs/protohar-authors-split/fedavg-s0 [--resume]
    python benchmarks/protohar_authors_split.py --authors /tmp/protohar_code \
        --method fedavg --run-authors runs/protohar-authors-split/authors-fedavg-s0.log
    python benchmarks/protohar_authors_split.py --authors /tmp/protohar_code \
        --runs runs/protohar-authors-split --ours runs/protohar-table2 --write results/protohar_authors_split.md

``fedwear reproduce protohar:table2`` makes its own 20-shot split of USC-HAD (subjects sorted,
numpy's Generator), so its clients hold other windows than those of the authors' code, which
takes ``os.listdir`` order and the legacy ``numpy.random`` state. A gap between its numbers and
the paper's can come from either the split or the implementation. This script runs fedwear's
packaged protocol (``protohar_usc_had.yaml``) on the windows of the authors' split instead
(``--authors``: a clone of github cheng-haha/ProtoHAR whose
``data/uschad/20k_14b_2p_data/{train,test}/<k>.npz`` were made by its own
``data/uschad/uschad_subdata.py``), client k = the authors' user k, through
``fedwear.run(data=...)``. Running the authors' ``main.py`` on the same files then compares the
two implementations on the same data: ``--run-authors LOG`` does that (its ``main.py`` with the
flags of its runexp.sh, ``--device -1 --nsr``, one thread, seed 0 as its ``--times 1``; the
modules it imports only to save results, h5py and ujson, stubbed when missing). With ``--runs``
the script runs nothing and writes, per method run there, the three side by side (``--write``):
the authors' code and fedwear on the authors' split, and fedwear's own run on its split
(``--ours``). The files are the authors' pickled dicts
(``{"x": [N, 1, 512, 6], "y": [N]}``), so they are loaded with ``allow_pickle``: only point this
at files you made yourself.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np

import fedwear
from fedwear.config import load_config
from fedwear.data.types import ClientData, FederatedData, Windows
from fedwear.reproduce import paper_table
from fedwear.reproduce.results import run_numbers

SPLIT = Path("data/uschad/20k_14b_2p_data")
CLASSES = [f"a{k}" for k in range(1, 13)]  # USC-HAD's 12 activities, the authors' labels 0..11
#: The authors' ``main.py --algorithm`` names of the methods their code has (runexp.sh).
ALGORITHM = {"fedavg": "FedAvg", "fedrep": "FedRep", "fedhome": "FedHome", "local": "Local", "protohar": "ProtoHAR"}
CHANNELS = ["acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z"]


def windows(path: Path) -> Windows:
    d = np.load(path, allow_pickle=True)["data"].item()
    x = np.asarray(d["x"], np.float32)[:, 0]  # [N, 1, 512, 6] -> [N, 512, 6]
    n = len(x)
    return Windows(x, np.asarray(d["y"], np.int64), np.zeros(n, np.int64), np.arange(n, dtype=np.int64))


def authors_split(authors: Path) -> FederatedData:
    root = authors / SPLIT
    users = sorted(int(p.stem) for p in (root / "train").glob("*.npz"))
    if not users:
        raise SystemExit(f"no {root}/train/<k>.npz: run the authors' data/uschad/uschad_subdata.py first")
    clients = []
    for k in users:
        train, test = windows(root / "train" / f"{k}.npz"), windows(root / "test" / f"{k}.npz")
        clients.append(ClientData(str(k), train, test, Windows.empty(512, 6)))
    return FederatedData("usc_had", clients, [], CLASSES, CHANNELS, 100.0, 512,
                         info={"root": str(root), "split": "the authors' uschad_subdata.py"})


#: Run the authors' main.py in its folder: one thread, and the modules used only by its result
#: saving (off with --nsr) stubbed when they are not installed.
AUTHORS_MAIN = (
    "import importlib.util, runpy, sys, types, torch\n"
    "torch.set_num_threads(1)\n"
    "for name in ('h5py', 'ujson'):\n"
    "    if importlib.util.find_spec(name) is None:\n"
    "        sys.modules[name] = types.ModuleType(name)\n"
    "sys.path.insert(0, '.')\n"
    "sys.argv = ['main.py', *sys.argv[1:]]\n"
    "runpy.run_path('main.py', run_name='__main__')\n"
)


def run_authors(authors: Path, method: str, log: Path, rounds: int | None = None) -> None:
    """The authors' ``main.py`` with runexp.sh's USC-HAD flags for ``method``, on the CPU
    (``rounds``: ``--num_global_iters``, runexp.sh's 300 by default)."""
    if method not in ALGORITHM:
        raise SystemExit(f"the authors' code has no {method!r}; choose one of {', '.join(ALGORITHM)}")
    flags = ["--dataset", "uschad", "--algorithm", ALGORITHM[method], "--batch_size", "32",
             "--num_global_iters", str(rounds or 300), "--local_epochs", "5",
             "--sampleratio", "1.0" if method == "local" else "0.15",
             "--lamda", "1.0" if method == "protohar" else "0.1", "--learning_rate", "0.001", "--model", "cnn",
             "--personal_learning_rate", "0.01", "--times", "1", "--niid", "20k2p", "--total_users", "14",
             "--device", "-1", "--slog", "--nsr"]
    if method == "fedhome":
        flags += ["--fine_epochs", "50"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        subprocess.run([sys.executable, "-c", AUTHORS_MAIN, *flags], cwd=authors, env=env, stdout=out,
                       stderr=subprocess.STDOUT, check=True)


def authors_rounds(log: Path, after_training: bool = False) -> dict[int, dict[str, float]]:
    """Per round of the authors' log: the train-weighted client mean of accuracy, macro-F1 and
    AUC (``Average Client Accurancy`` etc., what ``rs_glob_acc``/``rs_f1``/``rs_auc`` keep; SPECS A5),
    keyed as fedwear keys its rounds: by the rounds trained before the evaluation. The log's
    "Round number: r" comes before round r's training; ``after_training`` (the authors' SOLO,
    ``serverlocal.py``, evaluates after it) makes that key r + 1."""
    rounds: dict[int, dict[str, float]] = {}
    current = None
    patterns = {"accuracy": r"Average Client Accurancy:\s+([0-9.]+)", "auc": r"Average AUC Accurancy:\s+([0-9.]+)",
                "macro_f1": r"Average F1-Score Accurancy:\s+([0-9.]+)"}
    for line in log.read_text().splitlines():
        m = re.search(r"Round number:\s*(\d+)", line)
        if m:
            current = rounds.setdefault(int(m.group(1)), {})
            continue
        for key, pattern in patterns.items():
            m = re.search(pattern, line)
            if m and current is not None:
                current[key] = 100 * float(m.group(1))
    shift = int(after_training)
    return {r + shift: v for r, v in rounds.items() if len(v) == len(patterns)}


def summarise_authors(rounds: dict[int, dict[str, float]], after_training: bool = False) -> dict:
    best = max(rounds, key=lambda r: (rounds[r]["accuracy"], -r))
    last = max(rounds)
    # rounds trained: the last evaluated one, plus the round that follows a start-of-round evaluation
    return {"rounds": last + (not after_training), "best_round": best, "at_best": rounds[best], "final": rounds[last],
            "own_best": {k: max(v[k] for v in rounds.values()) for k in rounds[best]}}


def write_comparison(args: argparse.Namespace) -> None:
    """One table per method that has a fedwear run on the authors' split in ``--runs``: the
    authors' code (when ``authors-<method>-s<seed>.log`` is there), fedwear on the authors' split
    and fedwear on its own split (``--ours``), next to the paper."""
    keys = ("accuracy", "macro_f1", "auc")
    paper_rows = paper_table("protohar:table2")["rows"]
    script = f"python benchmarks/protohar_authors_split.py --authors {args.authors}"
    lines = [
        "# ProtoHAR's Table II: the authors' code and fedwear on the same split",
        "",
        "The authors' code: `main.py --algorithm <method>` with runexp.sh's flags, `--device -1`, seed 0 (the clone at "
        "the commit of results/bench_protohar_round.md, its split made by its own script as described there; the clone "
        "is not part of this repository). fedwear: the packaged `protohar_usc_had.yaml`, as `fedwear reproduce "
        "protohar:table2` runs it. SOLO (local) runs 60 rounds on both sides, as that table does (`--rounds 60`; "
        "runexp.sh: 300). Every round is evaluated at its start (round 0: untrained), except in the authors' SOLO, "
        "which evaluates after each round's training (its log's round r is keyed r + 1 here: rounds are counted as trained before the evaluation on both sides). Accuracy, F1 and AUC: train-weighted means over all 14 "
        "clients (SPECS A5), in %, at the round of best accuracy; max F1 / max AUC: each metric's own maximum over "
        "rounds. Paper: Cheng et al., IEEE JBHI 2023, Table II, mean of seeds 0-2.",
        "",
        "Produced by (per method M, with `--rounds 60` for local; `--run-authors` only for the methods the "
        f"authors' code has: {', '.join(ALGORITHM)}):",
        "",
        "```bash",
        f"{script} --method M --run-authors {args.runs}/authors-M-s{args.seed}.log",
        f"{script} --method M --seed {args.seed} --out {args.runs}/M-s{args.seed}",
        f"{script} --seed {args.seed} --runs {args.runs} --ours {args.ours} --write {args.write}",
        "```",
    ]
    methods = [m for m in paper_rows if (args.runs / f"{m}-s{args.seed}" / "config.yaml").exists()]
    if not methods:
        raise SystemExit(f"no {args.runs}/<method>-s{args.seed}: run fedwear on the authors' split first (--out)")
    head = ("| implementation | split | rounds run | best round | Acc | F1 | AUC "
            "| Acc − paper | max F1 | max AUC | final Acc |")
    for method in methods:
        paper = dict(zip(keys, paper_rows[method], strict=True))
        rows = []
        log = args.runs / f"authors-{method}-s{args.seed}.log"
        after = method == "local"  # the authors' SOLO evaluates after training, the others before
        evaluated = authors_rounds(log, after) if log.exists() else {}
        if evaluated:  # a run still starting has none yet
            rows.append(("the authors' code", "the authors'", summarise_authors(evaluated, after)))
        for label, split, where in (("fedwear", "the authors'", args.runs / f"{method}-s{args.seed}"),
                                    ("fedwear", "fedwear's", args.ours / f"{method}-s{args.seed}")):
            got = run_numbers(load_config(where / "config.yaml"), where) if (where / "config.yaml").exists() else None
            if got is not None:
                rows.append((label, split, got))
        lines += ["", f"## {method}", "",
                  f"Paper: Acc {paper['accuracy']:.2f}, F1 {paper['macro_f1']:.2f}, AUC {paper['auc']:.2f}.", "",
                  head, "|" + "---|" * (head.count("|") - 1)]
        for label, split, n in rows:
            a = n["at_best"]
            lines.append(f"| {label} | {split} | {n['rounds']} | {n['best_round']} | {a['accuracy']:.2f} | "
                         f"{a['macro_f1']:.2f} | {a['auc']:.2f} | {a['accuracy'] - paper['accuracy']:+.2f} | "
                         f"{n['own_best']['macro_f1']:.2f} | {n['own_best']['auc']:.2f} | {n['final']['accuracy']:.2f} |")
    args.write.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--authors", type=Path, required=True, help="the authors' clone, split made")
    ap.add_argument("--method", default="fedavg")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=None, help="default: the protocol's")
    ap.add_argument("--out", type=Path, help="fedwear's run folder on the authors' split")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--run-authors", type=Path, metavar="LOG", help="run the authors' main.py, its log to LOG")
    ap.add_argument("--runs", type=Path, help="write the comparison of every <method>-s<seed> run in this folder "
                    "(and authors-<method>-s<seed>.log beside it)")
    ap.add_argument("--ours", type=Path, default=Path("runs/protohar-table2"), help="with --runs: fedwear's runs on its own split")
    ap.add_argument("--write", type=Path, default=Path("results/protohar_authors_split.md"))
    args = ap.parse_args()
    if args.run_authors:
        run_authors(args.authors, args.method, args.run_authors, args.rounds)
        return
    if args.runs:
        write_comparison(args)
        return
    if args.out is None:
        ap.error("--out is required to run fedwear on the authors' split")
    data = authors_split(args.authors)
    config = resources.files("fedwear.reproduce") / "configs" / "protohar_usc_had.yaml"
    overrides = [f"method={args.method}", f"seed={args.seed}", f"dataset.root={args.authors / SPLIT}"]
    if args.rounds:
        overrides.append(f"rounds={args.rounds}")
    cfg = load_config(Path(str(config)), overrides=overrides)
    print(f"{len(data.clients)} clients, train {sum(len(c.train) for c in data.clients)}, "
          f"test {sum(len(c.test) for c in data.clients)} windows -> {args.out}")
    result = fedwear.run(cfg, args.out, resume=args.resume, quiet=False, data=data)
    print(result.summary.get("best", result.summary))


if __name__ == "__main__":
    main()
