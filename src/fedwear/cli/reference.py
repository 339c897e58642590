"""``fedwear config-reference``: every config key as Markdown (the source of docs/config.md)."""

from __future__ import annotations

import typer


def config_reference() -> None:
    """Every config key with its type, default and description, as Markdown.

    Regenerate the documentation with: fedwear config-reference > docs/config.md
    """
    from fedwear.config_reference import render

    typer.echo(render(), nl=False)
