"""What an exported model costs on a device: parameters, multiply-accumulates per window, file
size in float32 and after int8 dynamic quantisation (with what the quantisation does to the
client's score), and inference latency per window on one CPU thread through onnxruntime.

Latency is measured on the machine running the export, one window at a time (a watch classifies
the window it just recorded), as the median of repeated runs after a warm-up; it ranks models,
and a phone's or a watch's CPU gives other absolute numbers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
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


def _median_ms(run) -> float:
    """Median milliseconds of ``run()`` after a warm-up (:data:`LATENCY_RUNS`, :data:`LATENCY_S`)."""
    for _ in range(WARMUP_RUNS):
        run()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < LATENCY_RUNS or time.perf_counter() - start < LATENCY_S:
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def latency_ms(path: Path, window: np.ndarray) -> float:
    """Median milliseconds of one window through onnxruntime on one thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: np.ascontiguousarray(window[None], np.float32)}
    return _median_ms(lambda: session.run(None, feed))


def onnx_outputs(path: Path, x: np.ndarray, threads: int = 1) -> np.ndarray:
    """The ONNX model's outputs on windows ``x`` through onnxruntime's CPU provider."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: np.ascontiguousarray(x, np.float32)})[0]


@contextlib.contextmanager
def _native_quiet():
    """stderr silenced, down to its file descriptor: ExecuTorch's native libraries print notes on
    a machine unlike a phone (cpuinfo's, its thread pool's, torchao's about GPU kernels)."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null, warnings.catch_warnings(), contextlib.redirect_stderr(null):
            warnings.simplefilter("ignore")
            os.dup2(null.fileno(), 2)
            level = logging.getLogger().level
            logging.getLogger().setLevel(logging.CRITICAL)
            try:
                yield
            finally:
                logging.getLogger().setLevel(level)
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def executorch_runtime():
    """ExecuTorch's runtime: its ``Runtime`` and the module that sets its thread pool."""
    try:
        with _native_quiet():
            from executorch.extension.pybindings import portable_lib
            from executorch.runtime import Runtime
    except ImportError:
        from fedwear.errors import FedwearError

        raise FedwearError("fedwear export --format pte needs ExecuTorch: pip install 'fedwear[executorch]'") from None
    return Runtime, portable_lib


def _pte_method(path: Path):
    runtime, portable = executorch_runtime()
    with _native_quiet():
        if portable._threadpool_get_thread_count() != 1:
            portable._unsafe_reset_threadpool(1)  # one thread, as the ONNX latency
        return runtime.get().load_program(str(path)).load_method("forward")


def pte_outputs(path: Path, x: np.ndarray) -> np.ndarray:
    """The ExecuTorch program's outputs on windows ``x``, one window a call (its input shape)."""
    method = _pte_method(path)
    return np.concatenate([method.execute([torch.from_numpy(np.ascontiguousarray(w[None], np.float32))])[0].numpy()
                           for w in x])


def model_outputs(path: Path, x: np.ndarray) -> np.ndarray:
    """The outputs of an exported model (``.onnx`` through onnxruntime, ``.pte`` through ExecuTorch)."""
    return pte_outputs(path, x) if path.suffix == ".pte" else onnx_outputs(path, x)


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


def _test_windows(data: FederatedData, client: ClientData | None) -> tuple[np.ndarray, np.ndarray]:
    tests = [client] if client is not None else data.clients
    return np.concatenate([c.test.x for c in tests]).astype(np.float32), np.concatenate([c.test.y for c in tests])


def measure(module: torch.nn.Module, path: Path, data: FederatedData, client: ClientData | None,
            classes: tuple[int, ...] | None = None) -> dict:
    """The cost of the ONNX model ``path`` (exported from ``module``, its outputs the global
    labels ``classes``) on ``client``'s test windows (every training client's for the global model)."""
    x, y = _test_windows(data, client)
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


def measure_pte(module: torch.nn.Module, path: Path, data: FederatedData, client: ClientData | None,
                classes: tuple[int, ...] | None = None) -> dict:
    """:func:`measure` for an ExecuTorch program (fp32 on XNNPACK: its int8 needs a calibrated
    quantiser, so only the ONNX export reports int8)."""
    x, y = _test_windows(data, client)
    metric, fp32_score = score(pte_outputs(path, x), y, data.kind, classes)
    method = _pte_method(path)
    window = [torch.from_numpy(np.ascontiguousarray(x[:1]))]
    return {
        "parameters": parameters(module),
        "macs_per_window": macs_per_window(module, torch.from_numpy(x[0])),
        "bytes_fp32": path.stat().st_size,
        "metric": metric, "fp32": fp32_score, "windows": len(x),
        "latency_ms_fp32": _median_ms(lambda: method.execute(window)),
        "latency_note": "median of single windows, ExecuTorch XNNPACK, 1 thread, on the exporting machine",
    }
