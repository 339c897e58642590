"""fedwear: personalized federated learning on wearable sensor data."""

from fedwear.version import __version__


def run(*args, **kwargs):
    """See :func:`fedwear.api.run`."""
    from fedwear.api import run as _run

    return _run(*args, **kwargs)


__all__ = ["__version__", "run"]
