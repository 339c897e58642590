"""fedwear's version, and the versions and CPU a run's numbers depend on."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

__version__ = "0.1.0"


def library_versions() -> dict[str, str | None]:
    """What bit-for-bit reproducibility depends on (None: not installed or not known): the
    library versions, and the CPU, whose instruction set picks torch's float kernels
    (``cpu_capability``, e.g. AVX512 or AVX2; oneDNN's convolutions choose theirs from the same
    CPU), so the same versions on another kind of CPU can give other numbers."""
    import torch  # here, not at import time: `import fedwear` stays light for the CLI's --help

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "numpy", "scipy", "scikit-learn", "pandas", "flwr"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    out["cpu"] = cpu_model()
    out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def cpu_model() -> str | None:
    """The CPU's model name (Linux ``/proc/cpuinfo``, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
