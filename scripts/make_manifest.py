"""Write the pinned per-file manifest of a dataset: ``src/fedwear/data/manifests/<name>.sha256``.

Usage (from the repository root, with fedwear installed)::

    python scripts/make_manifest.py uci_hapt /path/to/uci_hapt
    python scripts/make_manifest.py usc_had /path/to/usc_had

``/path/to/<name>`` must be a complete copy in the original layout (``X`` or ``X.gz``); every file
the dataset's layout covers is hashed (decompressed content for ``X.gz``) with
:func:`fedwear.data.download.build_manifest`. Re-run it only from a copy whose provenance is
recorded in the registry entry's ``reference`` (``src/fedwear/data/download.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedwear.data.download import REGISTRY, build_manifest, format_manifest
from fedwear.errors import FedwearError

OUT = Path(__file__).resolve().parents[1] / "src" / "fedwear" / "data" / "manifests"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(REGISTRY))
    parser.add_argument("root", type=Path, help="folder holding a complete copy of the dataset")
    parser.add_argument("--out", type=Path, default=OUT, help="folder for <name>.sha256")
    args = parser.parse_args(argv)
    src = REGISTRY[args.name]
    try:
        hashes = build_manifest(src, args.root)
    except FedwearError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = args.out / f"{src.name}.sha256"
    path.write_text(format_manifest(src, hashes), encoding="utf-8")
    print(f"{path}: {len(hashes)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
