"""The tables of docs/rules.md, made from the tables they describe: the GPU conditions and the Xid buckets
(:mod:`watchd.model.conditions`) with the catalog's Xids of each bucket (:mod:`watchd.xid.catalog`).
``python -m watchd.xid.tables`` prints them; a test holds the docs to them."""

from __future__ import annotations

from watchd.model.conditions import GPU_CONDITIONS, XID_BUCKETS
from watchd.xid.catalog import known_xids, lookup

__all__ = ["buckets_markdown", "conditions_markdown", "numbers"]

_EN_DASH = "\u2013"


def conditions_markdown() -> str:
    """The condition table of docs/rules.md."""
    rows = ["| condition | `value` | detectors | shipped rule |", "|---|---|---|---|"]
    for c in GPU_CONDITIONS:
        rows.append(f"| `{c.name}` | {c.value} | {c.evidence} | {c.response} |")
    return "\n".join(rows)


def numbers(xids: list[int]) -> str:
    """Sorted Xid numbers, three or more in a row as a range with an en dash, as the docs write them:
    ``1\u20137, 9, 10``."""
    runs: list[list[int]] = []
    for xid in xids:
        if runs and xid == runs[-1][-1] + 1:
            runs[-1].append(xid)
        else:
            runs.append([xid])
    return ", ".join(
        f"{run[0]}{_EN_DASH}{run[-1]}" if len(run) >= 3 else ", ".join(str(x) for x in run) for run in runs
    )


def buckets_markdown() -> str:
    """The Xid bucket table of docs/rules.md, with the catalog's Xids of each bucket."""
    xids: dict[str, list[int]] = {}
    for xid in sorted(known_xids()):
        xids.setdefault(lookup(xid).bucket, []).append(xid)
    rows = ["| bucket | Xids | detectors | shipped rule |", "|---|---|---|---|"]
    for b in XID_BUCKETS:
        listed = numbers(xids.get(b.name, [])) or "any other"
        rows.append(f"| `{b.name}` | {listed} | {b.evidence} | {b.response} |")
    return "\n".join(rows)


if __name__ == "__main__":  # the tables of docs/rules.md: python -m watchd.xid.tables
    print(conditions_markdown(), buckets_markdown(), sep="\n\n")
