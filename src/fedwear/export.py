"""``fedwear export``: a finished run's models as files a phone or a watch runs.

Each training client's personalized model is the predictor its personalized view evaluates
(:func:`fedwear.report.embeddings.client_predictor`: the method's own personal parts, the
checkpoint's round, ``personalize`` seeded as the run seeds it); ``--global`` exports the
global model instead. An ONNX file (or, ``--format pte``, an ExecuTorch program lowered to
XNNPACK, the CPU delegate of ExecuTorch on Android and iOS) is written with a JSON beside it
naming what the model expects (window length, channels in order, sampling rate, the
normalisation to apply) and what it answers (classes in output order, or the forecast's units);
the JSON also holds the parity check (onnxruntime or ExecuTorch's runtime against PyTorch on
the client's test windows) and the on-device cost (:mod:`fedwear.device_cost`).
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedwear import files
from fedwear.data.types import ClientData, FederatedData
from fedwear.device_cost import executorch_runtime, measure, measure_pte, model_outputs
from fedwear.errors import FedwearError
from fedwear.evaluation.predictor import Predictor, as_predictor
from fedwear.models.spectral import Spectral
from fedwear.report.embeddings import Restored, client_predictor, restore_run

FORMATS = ("onnx", "pte")
#: Parity: the exported model's outputs within this of PyTorch's, and the same predicted classes.
#: ExecuTorch's kernels (XNNPACK's and its portable ones alike) round HART's attention a few float32
#: steps apart from PyTorch's (1.2e-5 on logits of 11), so there the bound is relative to the
#: output's size: ``TOLERANCE * max(1, |PyTorch's output|)``.
TOLERANCE = 1e-5


def _needs(fmt: str) -> None:
    if fmt == "pte":
        executorch_runtime()
        return
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise FedwearError("fedwear export needs onnx, onnxscript and onnxruntime: pip install 'fedwear[export]'"
                           ) from None


class AsModule(torch.nn.Module):
    """A predictor as one module for the exporter: the modules behind its body and head become
    submodules, so their weights are the graph's initializers."""

    def __init__(self, predictor: Predictor) -> None:
        super().__init__()
        self.predictor = predictor
        self.parts = torch.nn.ModuleList(_modules_behind(predictor.body) + _modules_behind(predictor.head))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictor(x)


def _modules_behind(fn: Callable | None) -> list[torch.nn.Module]:
    """The modules a body or head calls: itself, the module of a bound method, those its
    closure holds."""
    if fn is None:
        return []
    if isinstance(fn, torch.nn.Module):
        return [fn]
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return [owner]
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
    return [c for c in cells if isinstance(c, torch.nn.Module)]


def export_onnx(module: torch.nn.Module, example: torch.Tensor, path: Path, output: str) -> None:
    """``module`` as an ONNX file with a batch axis of any size: the TorchScript exporter (seconds),
    or torch.export's (a minute for a transformer) where tracing cannot capture a weight."""
    names = {"input_names": ["windows"], "output_names": [output]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporters' deprecation and tracer notes, not the user's to act on
        try:
            torch.onnx.export(module, (example,), str(path), dynamo=False,
                              dynamic_axes={"windows": {0: "batch"}, output: {0: "batch"}}, **names)
        except RuntimeError:
            torch.onnx.export(module, (example,), str(path), dynamo=True, external_data=False,
                              dynamic_shapes=({0: torch.export.Dim("batch")},), **names)


class Conv3dAsConv2d(torch.nn.Module):
    """A Conv3d whose kernel spans one step of depth, with depth stride 1 and no depth padding
    (all of FedMAT's and DeepSense's), as the same Conv2d over every depth slice: ExecuTorch 1.5
    has no 3-D convolution kernel, portable or XNNPACK."""

    def __init__(self, conv: torch.nn.Conv3d) -> None:
        super().__init__()
        self.conv = conv

    @staticmethod
    def fits(conv: torch.nn.Conv3d) -> bool:
        return conv.kernel_size[0] == 1 and conv.stride[0] == 1 and conv.padding[0] == 0 and conv.padding_mode == "zeros"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv
        b, channels, depth, h, w = x.shape
        y = torch.nn.functional.conv2d(x.transpose(1, 2).reshape(b * depth, channels, h, w), c.weight[:, :, 0],
                                       c.bias, c.stride[1:], c.padding[1:], c.dilation[1:], c.groups)
        return y.reshape(b, depth, *y.shape[1:]).transpose(1, 2)


@contextlib.contextmanager
def _for_executorch(module: torch.nn.Module):
    """``module`` with what ExecuTorch cannot run rewritten for the trace, restored after: a
    spectral input (FedMAT) as real DFT products (no complex tensors), and Conv3d as
    :class:`Conv3dAsConv2d`."""
    spectral = [m for m in module.modules() if isinstance(m, Spectral)]
    convs = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
             if isinstance(child, torch.nn.Conv3d)]
    if bad := [c for _, _, c in convs if not Conv3dAsConv2d.fits(c)]:
        raise FedwearError(f"--format pte: {bad[0]} spans depth, and ExecuTorch has no 3-D convolution kernel; "
                           "export it with --format onnx")
    try:
        for m in spectral:
            m.real_dft = True
        for parent, name, conv in convs:
            setattr(parent, name, Conv3dAsConv2d(conv))
        yield module
    finally:
        for m in spectral:
            m.real_dft = False
        for parent, name, conv in convs:
            setattr(parent, name, conv)


def export_pte(module: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
    """``module`` as an ExecuTorch program for one window a call (a device classifies the window
    it just recorded), lowered to XNNPACK where its operators allow and ExecuTorch's portable
    kernels elsewhere (:func:`_for_executorch` rewrites what neither runs)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        with _for_executorch(module):
            program = torch.export.export(module, (example[:1],))
        path.write_bytes(to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
                         .to_executorch().buffer)


@dataclass
class Parity:
    """The exported model (onnxruntime, ExecuTorch) against PyTorch on a client's test windows."""

    windows: int
    max_abs_diff: float
    same_predictions: bool
    #: the largest ``|difference| / max(1, |PyTorch's output|)``: what ExecuTorch's check bounds
    max_scaled_diff: float = 0.0
    scaled: bool = False

    @property
    def ok(self) -> bool:
        return (self.max_scaled_diff if self.scaled else self.max_abs_diff) <= TOLERANCE and self.same_predictions


def parity(predictor: Predictor, path: Path, x: np.ndarray, kind: str) -> Parity:
    """The exported model ``path`` against ``predictor``, the model the run evaluates, on windows
    ``x``, batched as the file takes them: all at once (ONNX), or one window a call (ExecuTorch,
    which matters where outputs depend on the batch: ``Method.batch_dependent_outputs``)."""
    if not len(x):
        return Parity(0, 0.0, True)
    x = np.ascontiguousarray(x, np.float32)
    with torch.no_grad():
        batches = [x[i : i + 1] for i in range(len(x))] if path.suffix == ".pte" else [x]
        expected = np.concatenate([predictor(torch.from_numpy(b)).float().numpy() for b in batches])
    got = model_outputs(path, x)
    scaled = path.suffix == ".pte"
    if got.shape != expected.shape:
        return Parity(len(x), math.inf, False, math.inf, scaled)
    same = kind == "regression" or bool((got.argmax(1) == expected.argmax(1)).all())
    diff = np.abs(got - expected)
    return Parity(len(x), float(diff.max()), same, float((diff / np.maximum(1.0, np.abs(expected))).max()), scaled)


def input_spec(data: FederatedData, client: str | None, batch: str | int = "batch") -> dict:
    """What the model expects: windows of ``window`` samples at ``rate_hz`` of ``channels`` in
    this order (float32, shape ``[batch, window, channels]``), normalised as the run normalised them."""
    norm = dict(data.info.get("normalize") or {"mode": "none"})
    per_client = norm.pop("clients", None)
    if per_client is not None:
        norm.update(per_client.get(client, {}) if client else {"note": "per client: export a client's model"})
    if "mean" in norm:
        norm["apply"] = "each channel: (x - mean) / std, with the statistics above"
    return {"name": "windows", "dtype": "float32", "shape": [batch, data.window, len(data.channels)],
            "window": data.window, "rate_hz": data.rate_hz, "seconds": data.window / data.rate_hz,
            "channels": list(data.channels), "normalization": norm}


def output_spec(data: FederatedData, predictor: Predictor) -> dict:
    if data.kind == "regression":
        shift, scale = data.target
        return {"name": "forecast", "kind": "regression", "to_units": f"value * {scale:g} + {shift:g}"}
    labels = predictor.classes if predictor.classes is not None else range(data.num_classes)
    return {"name": "logits", "kind": "classification", "classes": [data.class_names[k] for k in labels]}


@dataclass
class Exported:
    client: str  # "global" for the global model
    path: Path
    meta: dict


def _one(restored: Restored, client: ClientData | None, out: Path, cost: bool, fmt: str = "onnx") -> Exported:
    method, data, cfg, ckpt = restored.method, restored.data, restored.cfg, restored.checkpoint
    if client is None:
        message = method.global_message(ckpt["server"])
        if message is None:
            raise FedwearError(f"{restored.run.path}: method {cfg.method} has no global model; export a client's "
                               "(--client ID) or every client's")
        predictor, name = as_predictor(method.global_predictor(message)), "global"
        windows = np.concatenate([c.test.x for c in data.clients])  # the global model: every client's
    else:
        found = client_predictor(method, ckpt, client, cfg)
        if found is None:
            raise FedwearError(f"{restored.run.path}: method {cfg.method} has no personal model to export "
                               "(its personalized view evaluates none); try --global")
        predictor, name, windows = as_predictor(found), client.client_id, client.test.x
    module = AsModule(predictor).eval()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.{fmt}"
    shape = (2, data.window, len(data.channels))  # a client without test windows: traced on zeros
    example = torch.from_numpy(np.ascontiguousarray(windows[:2] if len(windows) else np.zeros(shape), np.float32))
    if fmt == "pte":
        export_pte(module, example, path)
    else:
        export_onnx(module, example, path, "forecast" if data.kind == "regression" else "logits")
    check = parity(predictor, path, windows, data.kind)
    if not check.ok:
        path.unlink()
        raise FedwearError(f"{path}: the {fmt} model does not compute what the run evaluates (max |difference| "
                           f"{check.max_abs_diff:.2e} on {check.windows} test windows, same predictions: "
                           f"{check.same_predictions}); nothing was written for it")
    meta = {"format": fmt, "file": path.name, "run": str(restored.run.path), "method": cfg.method,
            "round": int(ckpt["round"]), "model": cfg.model.name,
            "view": "global" if client is None else "personalized", "client": None if client is None else name,
            "input": input_spec(data, None if client is None else name, 1 if fmt == "pte" else "batch"),
            "output": output_spec(data, predictor),
            "parity": {"windows": check.windows, "max_abs_diff": check.max_abs_diff,
                       "same_predictions": check.same_predictions, "tolerance": TOLERANCE,
                       **({"max_scaled_diff": check.max_scaled_diff,
                           "bound": "|difference| <= tolerance * max(1, |PyTorch's output|)"} if check.scaled else {})}}
    if cost:
        meta["cost"] = (measure_pte if fmt == "pte" else measure)(module, path, data, client, predictor.classes)
    (out / meta_name(name, fmt)).write_text(json.dumps(meta, indent=2) + "\n")
    return Exported(name, path, meta)


def meta_name(name: str, fmt: str) -> str:
    """The JSON beside a model: ``<client>.json`` for ONNX, ``<client>.pte.json`` for ExecuTorch."""
    return f"{name}.json" if fmt == "onnx" else f"{name}.{fmt}.json"


def export_run(run_dir: Path, out: Path, clients: list[str] | None = None, global_model: bool = False,
               root: Path | None = None, cost: bool = True, on_done: Callable[[Exported], None] | None = None,
               fmt: str = "onnx") -> list[Exported]:
    """Every training client's personalized model of the run in ``run_dir`` (``clients``: those
    only; ``global_model``: the global model) as files of format ``fmt`` (:data:`FORMATS`) in
    ``out``, each with its JSON."""
    if fmt not in FORMATS:
        raise FedwearError(f"--format {fmt}: fedwear exports {', '.join(FORMATS)}")
    _needs(fmt)
    restored = restore_run(Path(run_dir), root)
    by_id = {c.client_id: c for c in restored.data.clients}
    unknown = [c for c in clients or [] if c not in by_id]
    if unknown:
        raise FedwearError(f"--client {unknown[0]}: not a training client of {run_dir} (its clients: "
                           f"{', '.join(by_id)})")
    chosen: list[ClientData | None] = [None] if global_model else [by_id[c] for c in clients or by_id]
    done = []
    for client in chosen:
        done.append(_one(restored, client, out, cost, fmt))
        if on_done:
            on_done(done[-1])
    return done


COST_HEADER = ("| method | parameters | MACs/window | fp32 KiB | int8 KiB | int8 score change | "
               "ms/window fp32 | ms/window int8 |\n|---|---:|---:|---:|---:|---:|---:|---:|")


def run_cost(run_dir: Path, root: Path | None = None) -> dict:
    """The on-device cost of the run's first training client's personalized model (its global
    model for a method without one), from ``RUN/export/<client>.json`` when an export with cost
    is there, else exported there now."""
    restored = restore_run(Path(run_dir), root)
    first = restored.data.clients[0]
    for name in (first.client_id, "global"):
        meta = Path(run_dir) / files.EXPORT / f"{name}.json"
        if meta.is_file() and "cost" in (saved := json.loads(meta.read_text())):
            return saved
    try:
        return _one(restored, first, Path(run_dir) / files.EXPORT, cost=True).meta
    except FedwearError:
        if restored.method.global_message(restored.checkpoint["server"]) is None:
            raise
        return _one(restored, None, Path(run_dir) / files.EXPORT, cost=True).meta


def cost_section(runs: dict[str, Path], root: Path | None = None) -> str:
    """Markdown: one row of :func:`run_cost` per method (``runs``: method -> one of its run folders)."""
    rows = [COST_HEADER]
    for method, run in runs.items():
        meta = run_cost(run, root)
        c = meta["cost"]
        change = c["int8"] - c["fp32"]
        unit = "pt" if c["metric"] == "accuracy" else ""
        shown = f"{100 * change:+.2f} {unit}" if c["metric"] == "accuracy" else f"{change:+.4f} MAE"
        rows.append(f"| {method} | {c['parameters']:,} | {c['macs_per_window']:,} | {c['bytes_fp32'] / 1024:.1f} | "
                    f"{c['bytes_int8'] / 1024:.1f} | {shown.strip()} | {c['latency_ms_fp32']:.3f} | "
                    f"{c['latency_ms_int8']:.3f} |")
    return ("## On-device cost\n\nEach method's first training client's personalized model as ONNX "
            "(`fedwear export`): int8 is onnxruntime's dynamic quantisation, its score change on that client's "
            "test windows; latency is the median of single windows through onnxruntime on one thread of this "
            "machine.\n\n" + "\n".join(rows))
