"""What an exported model costs on a device: parameters, multiply-accumulates per window, file
size in float32 and after int8 dynamic quantisation (with what the quantisation does to the
client's score), and inference latency per window on one CPU thread through onnxruntime.

Latency is measured on the machine running the export, one window at a time (a watch classifies
the window it just recorded), as the median of repeated runs after a warm-up; it ranks models,
and a phone's or a watch's CPU gives other absolute numbers.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from fedwear.data.types import ClientData, FederatedData

#: Latency: runs before timing, then timed runs (at least ``LATENCY_RUNS`` and ``LATENCY_S`` seconds).
WARMUP_RUNS, LATENCY_RUNS, LATENCY_S = 20, 200, 0.5


def parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def macs_per_window(module: torch.nn.Module, window: torch.Tensor) -> int:
    """Multiply-accumulates of one window's forward pass (half of torch's FLOP counter, which
    counts a multiply-add as two)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(window[None])
    return counter.get_total_flops() // 2


def latency_ms(path: Path, window: np.ndarray) -> float:
    """Median milliseconds of one window through onnxruntime on one thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: np.ascontiguousarray(window[None], np.float32)}
    for _ in range(WARMUP_RUNS):
        session.run(None, feed)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < LATENCY_RUNS or time.perf_counter() - start < LATENCY_S:
        t = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def onnx_outputs(path: Path, x: np.ndarray, threads: int = 1) -> np.ndarray:
    """The ONNX model's outputs on windows ``x`` through onnxruntime's CPU provider."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: np.ascontiguousarray(x, np.float32)})[0]


def score(outputs: np.ndarray, y: np.ndarray, kind: str, classes: tuple[int, ...] | None = None) -> tuple[str, float]:
    """Accuracy of logits (``classes``: the global label of each output, for a per-client label
    space), or mean absolute error in model units (regression)."""
    if kind == "regression":
        return "mae", float(np.abs(outputs.reshape(-1) - y.reshape(-1)).mean())
    predicted = outputs.argmax(1) if classes is None else np.asarray(classes)[outputs.argmax(1)]
    return "accuracy", float((predicted == y).mean())


def quantize_int8(path: Path) -> Path:
    """onnxruntime's dynamic quantisation of the weights to int8 (activations quantised at run
    time), beside ``path``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = path.with_name(path.stem + ".int8.onnx")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process (shape inference) is for static quantisation
    try:
        quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    return out


def measure(module: torch.nn.Module, path: Path, data: FederatedData, client: ClientData | None,
            classes: tuple[int, ...] | None = None) -> dict:
    """The cost of the ONNX model ``path`` (exported from ``module``, its outputs the global
    labels ``classes``) on ``client``'s test windows (every training client's for the global model)."""
    tests = [client] if client is not None else data.clients
    x = np.concatenate([c.test.x for c in tests]).astype(np.float32)
    y = np.concatenate([c.test.y for c in tests])
    int8 = quantize_int8(path)
    metric, fp32_score = score(onnx_outputs(path, x), y, data.kind, classes)
    _, int8_score = score(onnx_outputs(int8, x), y, data.kind, classes)
    return {
        "parameters": parameters(module),
        "macs_per_window": macs_per_window(module, torch.from_numpy(x[0])),
        "bytes_fp32": path.stat().st_size,
        "bytes_int8": int8.stat().st_size,
        "int8_file": int8.name,
        "metric": metric, "fp32": fp32_score, "int8": int8_score, "windows": len(x),
        "latency_ms_fp32": latency_ms(path, x[0]),
        "latency_ms_int8": latency_ms(int8, x[0]),
        "latency_note": "median of single windows, onnxruntime CPU, 1 thread, on the exporting machine",
    }
