"""``precision: bf16`` and ``compile: true`` on the CPU against plain fp32: a training step's
time, and a run's metrics.

    python benchmarks/cpu_step_options.py [--repeats 5] [--rounds 30] [--out FOLDER]

1. A training step (batch 32, SGD momentum 0.9, one thread) of the quickstart's cnn (UCI HAPT,
   128 x 6), HARCNN (ProtoHAR's protocol, 512 x 6) and HART (FedAli's, 128 x 6): in fp32, with
   the forward pass under ``torch.autocast("cpu", torch.bfloat16)`` (what ``precision: bf16``
   runs), and with the body and head under ``torch.compile`` (what ``compile: true`` runs; its
   compilation, in the first steps, is not timed): medians of interleaved repeats of 20 steps,
   milliseconds of CPU time a step.
2. The quickstart (``configs/quickstart.yaml``, the bundled UCI HAPT subset, ``--rounds``
   rounds) run in fp32 and in bf16: final personalized and global accuracy and macro-F1, and
   the run's CPU seconds.

Whether bf16 pays depends on the CPU: with AVX-512 BF16 or AMX the matmuls and convolutions run
on bf16 units; without, autocast only adds casts. The CPU's flags are printed first. The runs
write into a temporary folder unless ``--out`` names one.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import fedwear
from fedwear.config import load_config
from fedwear.models import build_model
from fedwear.rundir import RunFolder

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
MODELS = {"cnn (quickstart)": ("cnn", 128, 6, 6, {}), "HARCNN (ProtoHAR)": ("harcnn", 512, 6, 12, {}),
          "HART (FedAli)": ("hart", 128, 6, 6, {"liteformer": "code"})}


def cpu_flags() -> str:
    try:
        flags = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no lscpu)"
    wanted = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f")
    return ", ".join(f for f in wanted if f" {f}" in flags) or "none of " + ", ".join(wanted)


SIDES = ("fp32", "bf16", "compiled")


def stepper(name: str, window: int, channels: int, classes: int, options: dict, side: str):
    """A function running ``steps`` training steps of the model on ``side``, returning CPU-ms a step."""
    torch.manual_seed(0)
    model = build_model(name, window, channels, classes, **options)
    if side == "compiled":
        model.body.compile()
        model.head.compile()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, window, channels), torch.randint(0, classes, (32,))

    def steps(n: int = 20) -> float:
        t = time.process_time()
        for _ in range(n):
            with torch.autocast("cpu", torch.bfloat16, enabled=side == "bf16"):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return 1000 * (time.process_time() - t) / n

    steps(2)  # warm-up: the compilation, oneDNN's first-call setup
    return steps


def run(precision: str, rounds: int, out: Path) -> dict:
    cfg = load_config(CONFIG, overrides=[f"precision={precision}", f"rounds={rounds}", "threads=1"])
    result = fedwear.run(cfg, out / precision)
    final = result.summary["final"]
    cpu_s = RunFolder(result.out_dir).cpu_s()
    return {view: (100 * final[view]["accuracy"], 100 * final[view]["macro_f1"]) for view in ("personalized", "global")
            } | {"cpu_s": cpu_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path, help="folder for the two runs (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}; CPU flags: {cpu_flags()}\n")
    print("| model | fp32 ms/step | bf16 ms/step | bf16 / fp32 | compiled ms/step | compiled / fp32 |\n"
          "|---|---:|---:|---:|---:|---:|")
    for label, (name, window, channels, classes, options) in MODELS.items():
        run_steps = {side: stepper(name, window, channels, classes, options, side) for side in SIDES}
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(args.repeats):
            for side in SIDES:
                times[side].append(run_steps[side]())
        ms = {side: statistics.median(times[side]) for side in SIDES}
        print(f"| {label} | {ms['fp32']:.1f} | {ms['bf16']:.1f} | {ms['bf16'] / ms['fp32']:.2f}x | "
              f"{ms['compiled']:.1f} | {ms['compiled'] / ms['fp32']:.2f}x |", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        got = {p: run(p, args.rounds, out) for p in ("fp32", "bf16")}
    print(f"\nconfigs/quickstart.yaml, {args.rounds} rounds, one thread: final round, test-weighted means (%)\n")
    print("| precision | personalized acc | personalized F1 | global acc | global F1 | CPU-s |\n|---|---:|---:|---:|---:|---:|")
    for p, g in got.items():
        print(f"| {p} | {g['personalized'][0]:.2f} | {g['personalized'][1]:.2f} | {g['global'][0]:.2f} | "
              f"{g['global'][1]:.2f} | {g['cpu_s']:.1f} |")


if __name__ == "__main__":
    main()
