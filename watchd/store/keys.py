"""Every key the state database files things under, built in one place. The strings are stored: they must
stay byte for byte what earlier versions wrote, or a restart forgets cooldowns, intents and alerts."""

from __future__ import annotations


def action(kind: str, node: str) -> str:
    """An action of one node: its intents and its cooldown (``"drain:gpu-7"``)."""
    return f"{kind}:{node}"


def drain(node: str) -> str:
    return action("drain", node)


def requeue(node: str) -> str:
    """A requeue of every job on the node."""
    return action("requeue", node)


def requeue_job(node: str, job: str) -> str:
    """A requeue of one job: it does not stand for the node's other jobs."""
    return f"{requeue(node)}:{job}"


def drain_replacing_reason(node: str) -> str:
    """A drain that replaces watchd's own reason: the drain it follows must not swallow it."""
    return f"drain-reason:{node}"


def spares(partition: str) -> str:
    """The hot spares of one partition (the ``spare`` action: one change in flight at a time)."""
    return f"spare:{partition}"


def rule_pool(rule: str) -> str:
    """The breaker window's pool that counts one rule's disruptions (its rate limit)."""
    return f"rule:{rule}"


def dry_run_pool(pool: str) -> str:
    """What dry-run counts apart, so that it never fills the real window."""
    return f"dry-run:{pool}"


def held_event(held_id: int) -> str:
    """The event id in the audit trail of an operator's release or discard of a held action."""
    return f"held-{held_id}"


_BREAKER_ALERT = "breaker/"


def breaker_alert(pool: str) -> str:
    """The firing-alert key of a pool's blast-radius breaker alert."""
    return _BREAKER_ALERT + pool


def breaker_pool(alert_key: str) -> str | None:
    """The pool of a breaker alert's key; None for any other alert."""
    return alert_key.removeprefix(_BREAKER_ALERT) if alert_key.startswith(_BREAKER_ALERT) else None


def rule_alert(rule: str, group: str, labels: dict[str, str]) -> str:
    """A rule's alert, keyed by its group and its label set, as Alertmanager tells alerts apart."""
    return f"{rule}/{group}/" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
