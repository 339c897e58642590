"""Registry of federated methods: one file per method, named after it.

Every module of this package that defines a :class:`Method` subclass with its own ``name`` is
registered (so a new method is one new file); a method defined elsewhere registers itself with
``METHODS[MyMethod.name] = MyMethod``.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil

from fedwear.errors import ConfigError, validate_options
from fedwear.methods.api import Method, Options, Record, Task


def _discover() -> dict[str, type[Method]]:
    found: dict[str, type[Method]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, Method) and obj.__module__ == module.__name__
                    and "name" in vars(obj)):
                found[obj.name] = obj
    return found


METHODS: dict[str, type[Method]] = _discover()


def unknown_method(name: str) -> str:
    """``unknown method 'fedavgg'; did you mean fedavg? see `fedwear methods` ...``: the closest names."""
    close = difflib.get_close_matches(name, METHODS, n=3)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return f"unknown method {name!r}; {hint}see `fedwear methods` for all of them"


def method_class(name: str) -> type[Method]:
    if name not in METHODS:
        raise ConfigError(f"method: {unknown_method(name)}")
    return METHODS[name]


def parse_options(name: str, raw: dict | None) -> Options:
    """Validate ``method_options.<name>`` against the method's Options model."""
    return validate_options(method_class(name).Options, raw, f"method_options.{name}")


def build_method(task: Task) -> Method:
    """The configured method (``fedwear.privacy.private`` wraps it for ``privacy.dp``)."""
    cfg = task.training
    return method_class(cfg.method)(task, parse_options(cfg.method, cfg.options))


__all__ = ["METHODS", "Method", "Options", "Record", "Task", "build_method", "method_class", "parse_options"]
