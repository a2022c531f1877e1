"""Errors that reach the user as one clear line (the CLI prints them without a traceback), each with the
exit status that tells a script what went wrong (docs/cli.md, "Exit status")."""

#: the command ran and its answer is a failure: a check failed, a test failed, a rule file has problems
EXIT_FAILED = 1
#: the command line or a file it names is wrong (argparse's own status)
EXIT_USAGE = 2
#: no answer from the engine: not running, wrong address, TLS failed, timed out, or not ready (HTTP 503)
EXIT_UNREACHABLE = 3
#: the engine answered and refused: no credential or a wrong one (401), not allowed (403), or the change
#: it was asked for is not its to make (409: a node someone else drained)
EXIT_REFUSED = 4
#: the engine does not offer what was asked: the feature is not enabled in its config
EXIT_NOT_ENABLED = 5


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2 (subclasses say another, in ``exit_code``)."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A configuration or rule file is invalid; the message names the file, the key path and the reason."""


class Unreachable(UsageError):
    """No answer from the engine (connection, TLS, time-out, HTTP 503)."""

    exit_code = EXIT_UNREACHABLE


class Refused(UsageError):
    """The engine refused the request: 401, 403 or 409."""

    exit_code = EXIT_REFUSED


class NotEnabled(UsageError):
    """The engine does not offer this: the feature is off in its config."""

    exit_code = EXIT_NOT_ENABLED


class Failed(UsageError):
    """The engine answered with an error of its own (HTTP 5xx but 503)."""

    exit_code = EXIT_FAILED
