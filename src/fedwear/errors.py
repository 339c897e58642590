"""User-facing errors: the CLI prints their message as one line, without a traceback."""


class FedwearError(Exception):
    """A mistake in the user's input (config, data, options) with a message saying what to do."""


class ConfigError(FedwearError):
    """An invalid config key or value."""


class DataError(FedwearError):
    """Missing, corrupt or unusable data files."""
