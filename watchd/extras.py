"""Optional dependencies, installed as extras: ``watchd[postgres]`` (the PostgreSQL state store and its
database lease) and ``watchd[kubernetes]`` (the Kubernetes scheduler, fleet, lease and checks). An agent node
needs neither. A module that needs one imports it inside ``try`` and raises :func:`missing_extra` on
ImportError, so the user reads which extra to install instead of a traceback."""

from __future__ import annotations

from watchd.errors import ConfigError

#: extra -> (what needs it, the distribution the error names)
EXTRAS: dict[str, tuple[str, str]] = {
    "postgres": ("the PostgreSQL state store (state.kind: postgres)", "psycopg"),
    "kubernetes": ("the Kubernetes integration (scheduler, fleet, leader election, checks)", "lightkube"),
}


def missing_extra(extra: str, exc: ImportError) -> ConfigError:
    """The one-line error for a missing optional dependency: what needs it and the pip command."""
    needs, dist = EXTRAS[extra]
    return ConfigError(
        f"{needs} needs {dist}, which is not installed ({exc}): pip install 'watchd[{extra}]'"
        " (the Debian package includes it)"
    )
