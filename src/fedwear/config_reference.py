"""The configuration reference (``docs/config.md``), generated from the pydantic models.

:func:`render` walks :class:`fedwear.config.RunConfig` generically: every field of every
nested model becomes a row (dotted key, type, default, description), every nested model a
section, and the two registries whose entries bring their own options models add one section
per entry: ``model.options`` (``MODELS[name].Options``) and ``method_options.<name>``
(``METHODS[name].Options``). A key added to any of these models appears without touching
this file. ``fedwear config-reference > docs/config.md`` regenerates the document;
``tests/test_docs.py`` fails when the two disagree.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

COMMAND = "fedwear config-reference > docs/config.md"


@dataclass
class Section:
    """One table of the reference: heading, introduction, rows of (key, type, default, text)."""

    heading: str
    intro: str = ""
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    level: int = 2
    empty: str = ""


@dataclass
class Registry:
    """A dict-valued key whose allowed content depends on names of a registry.

    ``keyed``: the dict holds one entry per name (``method_options.<name>.<option>``); otherwise
    it holds the options of the one entry named by ``selector`` (``model.options.<option>``).
    """

    selector: str
    entries: Callable[[], dict[str, type]]
    describe: Callable[[type], str]
    keyed: bool


def _model_registry() -> dict[str, type]:
    from fedwear.models import MODELS

    return dict(MODELS)


def _method_registry() -> dict[str, type]:
    from fedwear.methods import METHODS

    return dict(METHODS)


def _dataset_registry() -> dict[str, object]:
    from fedwear.data import DATASETS

    return dict(DATASETS)


def _summary(cls: type) -> str:
    return str(getattr(cls, "summary", ""))


def _doc(cls: type) -> str:
    """The first paragraph of a class's own docstring (not an inherited one), on one line."""
    doc = cls.__dict__.get("__doc__")
    if not doc:
        return ""
    return _text(inspect.cleandoc(doc).split("\n\n")[0].replace("``", "`"))


def _text(s: str | None) -> str:
    """One table-safe line: newlines folded, pipes escaped."""
    return " ".join((s or "").split()).replace("|", "\\|")


#: dotted key -> registry whose entries declare an ``Options`` model for that key
REGISTRIES: dict[str, Registry] = {
    "model.options": Registry("model.name", _model_registry, _doc, keyed=False),
    "method_options": Registry("method", _method_registry, _summary, keyed=True),
}

#: dotted key -> the registry its value names (listed after the key's description)
CHOICES: dict[str, Callable[[], dict[str, Any]]] = {
    "method": _method_registry,
    "dataset.name": _dataset_registry,
    "model.name": _model_registry,
}


def render() -> str:
    """The whole reference as Markdown (ends with one newline)."""
    from fedwear.config import RunConfig

    sections = _sections(RunConfig, "", Section("Top level", _doc(RunConfig)))
    out = [
        "# Configuration reference",
        "",
        "Every key of a run config with its type, default and description. Nested keys are",
        "dotted: `dataset.window: 64` inside `dataset:` in YAML is `--set dataset.window=64` on",
        "the command line. Unknown keys, wrong types and values outside the allowed range stop a",
        "run with a one-line error naming the key.",
        "",
        "Generated from the pydantic models (`src/fedwear/config.py`,",
        "`src/fedwear/data/config.py`, the models' and methods' `Options`) by",
        "`src/fedwear/config_reference.py`; do not edit by hand. Regenerate with",
        f"`{COMMAND}`.",
        "",
        "Sections: " + ", ".join(_section_name(s) for s in sections if s.level == 2) + ".",
        "",
    ]
    for s in sections:
        out += _render_section(s)
    return "\n".join(out).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- walking the models


def _sections(model: type[BaseModel], prefix: str, section: Section) -> list[Section]:
    """``section`` filled with the rows of ``model``'s fields, then the sections of its nested
    models and registries, in field order (depth first)."""
    children: list[Section] = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = info.annotation
        nested = _single_model(ann)
        if nested is not None:
            intro = sentences(info.description or "", _doc(nested))
            if _allows_none(ann):
                intro = sentences(intro, "May be `null`.")
            children += _sections(nested, f"{key}.", Section(f"`{key}`", intro))
            continue
        section.rows.append(
            (key, _type_cell(ann, info), _default_cell(info), _description(key, info))
        )
        for inner, suffix in _models_inside(ann):
            children += _sections(
                inner, f"{key}{suffix}.", Section(f"`{key}{suffix}`", _doc(inner))
            )
        if key in REGISTRIES:
            children += _registry_sections(key, REGISTRIES[key])
    return [section, *children]


def _registry_sections(key: str, reg: Registry) -> list[Section]:
    entries = reg.entries()
    head = Section(
        f"`{key}`",
        f"Checked against the `Options` of the entry named by `{reg.selector}` "
        f"({', '.join(f'`{n}`' for n in entries)}); one table per entry.",
    )
    out = [head]
    for name, cls in entries.items():
        options = getattr(cls, "Options", None)
        sub_key = f"{key}.{name}" if reg.keyed else key
        heading = f"`{sub_key}`" if reg.keyed else f"`{key}` when `{reg.selector}: {name}`"
        sub = Section(heading, _text(reg.describe(cls)), level=3, empty="No options.")
        if isinstance(options, type) and issubclass(options, BaseModel):
            found = _sections(options, f"{sub_key}.", sub)
            for s in found[1:]:
                s.level = 3
            out += found
        else:
            out.append(sub)
    return out


def _single_model(ann: Any) -> type[BaseModel] | None:
    """The model class when ``ann`` is a model or ``model | None``; None otherwise."""
    args = [a for a in _union_args(ann) if a is not type(None)]
    if len(args) == 1 and _is_model(args[0]):
        return args[0]
    return None


def _models_inside(ann: Any) -> list[tuple[type[BaseModel], str]]:
    """Models held in a list or dict (``key[]`` / ``key.<name>``), for their own sections."""
    out = []
    for a in _union_args(ann):
        origin, args = typing.get_origin(a), typing.get_args(a)
        if origin in (list, tuple, set, frozenset) and args and _is_model(args[0]):
            out.append((args[0], "[]"))
        elif origin is dict and len(args) == 2 and _is_model(args[1]):
            out.append((args[1], ".<name>"))
    return out


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _union_args(ann: Any) -> tuple[Any, ...]:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return typing.get_args(ann)
    return (ann,)


def _allows_none(ann: Any) -> bool:
    return type(None) in _union_args(ann)


# --------------------------------------------------------------------------- cells


def type_name(ann: Any) -> str:
    """A short, YAML-minded name of a type: ``int | null``, ``"sgd" | "adam"``, ``list[str]``."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is type(None) or ann is None:
        return "null"
    if ann is Any:
        return "any"
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    if isinstance(ann, type):
        return ann.__name__
    return str(ann).replace("typing.", "")


_BOUNDS = ((at.Ge, "ge", "≥"), (at.Gt, "gt", ">"), (at.Le, "le", "≤"), (at.Lt, "lt", "<"))


def constraints(info: FieldInfo) -> list[str]:
    """Declared bounds and lengths of a field, as ``≥ 1`` or ``at least 2 items``."""
    unit = "character" if info.annotation is str else "item"
    out = []
    for m in info.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(m, kind):
                out.append(f"{sign} {getattr(m, attr)}")
        if isinstance(m, at.MinLen):
            out.append(f"at least {_count(m.min_length, unit)}")
        if isinstance(m, at.MaxLen):
            out.append(f"at most {_count(m.max_length, unit)}")
        if isinstance(m, at.MultipleOf):
            out.append(f"multiple of {m.multiple_of}")
    return out


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}{'s' if n != 1 else ''}"


def sentences(*texts: str) -> str:
    """The non-empty ``texts`` joined as sentences (a full stop added where one ends without)."""
    parts = [t.strip() for t in texts if t.strip()]
    return " ".join(p if p.endswith((".", "?", ":")) else p + "." for p in parts)


def default_value(info: FieldInfo) -> Any:
    """The field's default (``default_factory`` called); ``PydanticUndefined`` when required."""
    if info.default_factory is not None:
        factory = typing.cast(Callable[[], Any], info.default_factory)
        return factory()
    return info.default


def _type_cell(ann: Any, info: FieldInfo) -> str:
    cell = f"`{type_name(ann)}`"
    bounds = constraints(info)
    return _text(f"{cell}, {', '.join(bounds)}" if bounds else cell)


def _default_cell(info: FieldInfo) -> str:
    value = default_value(info)
    if value is PydanticUndefined:
        return "required"
    return _text(f"`{json.dumps(_plain(value), ensure_ascii=False)}`")


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, tuple | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _description(key: str, info: FieldInfo) -> str:
    text = _text(info.description)
    if key in CHOICES:
        names = ", ".join(f"`{n}`" for n in CHOICES[key]())
        text = f"{text}; registered: {names}" if text else f"registered: {names}"
    return text


# --------------------------------------------------------------------------- Markdown


def _section_name(s: Section) -> str:
    return s.heading if s.heading.startswith("`") else s.heading.lower()


def _render_section(s: Section) -> list[str]:
    out = ["#" * s.level + " " + s.heading, ""]
    if s.intro:
        out += [s.intro, ""]
    if s.rows:
        out += ["| key | type | default | description |", "|---|---|---|---|"]
        out += [f"| `{k}` | {t} | {d} | {desc} |" for k, t, d, desc in s.rows]
        out.append("")
    elif s.empty.strip():
        out += [s.empty, ""]
    return out


__all__ = [
    "CHOICES",
    "COMMAND",
    "REGISTRIES",
    "constraints",
    "default_value",
    "render",
    "type_name",
]
