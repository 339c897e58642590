"""User-facing errors: the CLI prints their message as one line, without a traceback."""

import errno

#: ``OSError.errno`` values of a full disk and of a folder one may not write to: the user's file
#: system, not fedwear, so they are reported in one line (the CLI, downloads), never as a bug.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
NO_ACCESS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


class FedwearError(Exception):
    """A mistake in the user's input (config, data, options) with a message saying what to do."""


class ConfigError(FedwearError):
    """An invalid config key or value."""


class DataError(FedwearError):
    """Missing, corrupt or unusable data files."""


def did_you_mean(key: str, allowed, prefix: str = "") -> str:
    """``"did you mean '<prefix><closest>'? "`` for the allowed name closest to a mistyped ``key``
    (``difflib``), or ``""`` when none is close."""
    import difflib

    close = difflib.get_close_matches(key, [str(a) for a in allowed], n=1)
    return f"did you mean {prefix + close[0]!r}? " if close else ""


def validate_options(options_model, raw: dict | None, where: str, owner: str | None = None):
    """``options_model(**raw)``, or a one-line ConfigError naming ``<where>.<key>`` and the
    options (of ``owner``, when given) (shared by method options and model options)."""
    from pydantic import ValidationError

    try:
        return options_model(**(raw or {}))
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        allowed = ", ".join(options_model.model_fields) or "none"
        label = f"options of {owner}" if owner else "options"
        hint = did_you_mean(str(err["loc"][-1]), options_model.model_fields, f"{where}.") \
            if err["type"] == "extra_forbidden" else ""
        raise ConfigError(f"{where}.{key}: {err['msg']} (got {err.get('input')!r}; {hint}{label}: {allowed})") from None
