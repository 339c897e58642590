"""``fedwear export``: a finished run's personalized models (or its global model) as ONNX files or
ExecuTorch programs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedwear import files
from fedwear.cli.common import one_line_errors


def export(
    run: Annotated[Path, typer.Argument(help="a run directory (from `fedwear run`) with its checkpoint.npz")],
    client: Annotated[list[str] | None, typer.Option(
        help="this training client's model (repeat for several; default: every training client's)")] = None,
    global_model: Annotated[bool, typer.Option(
        "--global", help="the global model instead of the personalized ones")] = False,
    fmt: Annotated[str, typer.Option("--format", help="onnx (onnxruntime), or pte (ExecuTorch, XNNPACK)")] = "onnx",
    out: Annotated[Path | None, typer.Option(help="folder for the files (default RUN/export)")] = None,
    root: Annotated[Path | None, typer.Option(
        help="the dataset folder, instead of dataset.root of the run's config.yaml")] = None,
    cost: Annotated[bool, typer.Option(
        "--cost/--no-cost", help="measure parameters, MACs, size in fp32 and int8, and latency")] = True,
) -> None:
    """Write each client's personalized model as an ONNX file (or an ExecuTorch program) for a device,
    with a JSON of its input, outputs and cost.

    The model is the one the run's personalized view evaluates, checked in onnxruntime (or ExecuTorch's
    runtime) against it on the client's test windows."""
    from fedwear.errors import FedwearError
    from fedwear.export import export_run

    with one_line_errors():
        if client and global_model:
            raise FedwearError("--client and --global: export the personalized models or the global one, not both")
        target = out or run / files.EXPORT

        def done(e) -> None:
            p, c = e.meta["parity"], e.meta.get("cost")
            line = f"{e.path}: max |{fmt} - PyTorch| {p['max_abs_diff']:.1e} on {p['windows']} test windows"
            if c:
                int8 = f" (int8 {c['bytes_int8'] / 1024:.1f} KiB)" if "bytes_int8" in c else ""
                line += (f"; {c['parameters']:,} parameters, {c['macs_per_window']:,} MACs/window, "
                         f"{c['bytes_fp32'] / 1024:.1f} KiB{int8}, {c['latency_ms_fp32']:.3f} ms/window on 1 thread")
            typer.echo(line)

        export_run(run, target, client, global_model, root, cost, on_done=done, fmt=fmt)
