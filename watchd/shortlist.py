"""A long list, shown short: in a finding's summary and as the template filter ``shortlist``
(``{{ suspects | shortlist(8) }}``)."""

from __future__ import annotations

from collections.abc import Sequence

#: the most items a template may ask to see
MAX_SHOWN = 1000


def shortlist(value: object, shown: int = 8) -> str:
    """``a,b,c,d`` (comma-separated text, or a list) as ``a, b and 2 more`` when ``shown`` is 2: a no-culprit
    hang of a 2,000-node job names its first suspects in an alert, not all 2,000."""
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, Sequence):
        items = [str(item) for item in value]
    else:
        items = [str(value)]
    shown = max(1, min(int(shown), MAX_SHOWN))
    if len(items) <= shown:
        return ", ".join(items)
    return f"{', '.join(items[:shown])} and {len(items) - shown} more"
