"""fedwear on the authors' own USC-HAD split: tells implementation from data in Table II gaps.

    python benchmarks/protohar_authors_split.py --authors /tmp/protohar_code \
        --method fedavg --seed 0 --out runs/protohar-authors-split/fedavg-s0 [--resume]

``fedwear reproduce protohar:table2`` makes its own 20-shot split of USC-HAD (subjects sorted,
numpy's Generator), so its clients hold other windows than those of the authors' code, which
takes ``os.listdir`` order and the legacy ``numpy.random`` state. A gap between its numbers and
the paper's can come from either the split or the implementation. This script runs fedwear's
packaged protocol (``protohar_usc_had.yaml``) on the windows of the authors' split instead
(``--authors``: a clone of github cheng-haha/ProtoHAR whose
``data/uschad/20k_14b_2p_data/{train,test}/<k>.npz`` were made by its own
``data/uschad/uschad_subdata.py``), client k = the authors' user k, through
``fedwear.run(data=...)``. Running the authors' ``main.py`` on the same files then compares the
two implementations on the same data. The files are the authors' pickled dicts
(``{"x": [N, 1, 512, 6], "y": [N]}``), so they are loaded with ``allow_pickle``: only point this
at files you made yourself.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

import numpy as np

import fedwear
from fedwear.config import load_config
from fedwear.data.types import ClientData, FederatedData, Windows

SPLIT = Path("data/uschad/20k_14b_2p_data")
CLASSES = [f"a{k}" for k in range(1, 13)]  # USC-HAD's 12 activities, the authors' labels 0..11
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--authors", type=Path, required=True, help="the authors' clone, split made")
    ap.add_argument("--method", default="fedavg")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=None, help="default: the protocol's")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
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
