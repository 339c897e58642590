"""Registry of federated methods: one file per method, named after it."""

from __future__ import annotations

from fedwear.errors import ConfigError, validate_options
from fedwear.methods.api import Method, Options, Record, Task
from fedwear.methods.centralized import Centralized
from fedwear.methods.fedavg import FedAvg
from fedwear.methods.fedprox import FedProx
from fedwear.methods.local import Local

METHODS: dict[str, type[Method]] = {m.name: m for m in (FedAvg, FedProx, Local, Centralized)}


def method_class(name: str) -> type[Method]:
    if name not in METHODS:
        raise ConfigError(f"method: unknown method {name!r}; choose one of {', '.join(sorted(METHODS))}")
    return METHODS[name]


def parse_options(name: str, raw: dict | None) -> Options:
    """Validate ``method_options.<name>`` against the method's Options model."""
    return validate_options(method_class(name).Options, raw, f"method_options.{name}")


def build_method(task: Task) -> Method:
    """The configured method, wrapped for differential privacy when ``privacy.dp`` asks for it."""
    cfg = task.config
    method = method_class(cfg.method)(task, parse_options(cfg.method, cfg.method_options.get(cfg.method)))
    if cfg.privacy.dp == "central":
        from fedwear.privacy import CentralDP

        return CentralDP(method)  # type: ignore[return-value]
    return method


__all__ = ["METHODS", "Method", "Options", "Record", "Task", "build_method", "method_class", "parse_options"]
