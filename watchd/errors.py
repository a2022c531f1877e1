"""Errors that reach the user as one clear line (the CLI prints them without a traceback)."""


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2."""


class ConfigError(UsageError):
    """A configuration or rule file is invalid; the message names the file, the key path and the reason."""
