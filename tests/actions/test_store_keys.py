"""The keys the state database files things under are stored: they must stay what earlier versions wrote."""

from watchd.actions.handlers import handler_for
from watchd.rules import PlannedAction
from watchd.store import keys


def test_keys_are_byte_for_byte_what_earlier_versions_stored() -> None:
    assert keys.action("resume", "gpu-7") == "resume:gpu-7"
    assert keys.drain("gpu-7") == "drain:gpu-7"
    assert keys.requeue("gpu-7") == "requeue:gpu-7"
    assert keys.requeue_job("gpu-7", "slurm:12") == "requeue:gpu-7:slurm:12"
    assert keys.drain_replacing_reason("gpu-7") == "drain-reason:gpu-7"
    assert keys.rule_pool("xid-fatal") == "rule:xid-fatal"
    assert keys.dry_run_pool("gpu") == "dry-run:gpu"
    assert keys.dry_run_pool(keys.rule_pool("r")) == "dry-run:rule:r"
    assert keys.held_event(3) == "held-3"
    assert keys.breaker_alert("gpu") == "breaker/gpu"
    assert keys.breaker_pool("breaker/gpu") == "gpu" and keys.breaker_pool("r/gpu-1/alertname=r") is None
    labels = {"node": "gpu-1", "alertname": "r", "severity": "critical"}
    assert keys.rule_alert("r", "gpu-1", labels) == "r/gpu-1/alertname=r,node=gpu-1,severity=critical"


def test_each_handler_keys_its_intents_as_before() -> None:
    def key(kind: str, **params: object) -> str | None:
        return handler_for(kind).key(PlannedAction(kind, "gpu-7", params))

    assert key("drain", reason="x") == "drain:gpu-7"
    assert key("drain", reason="x", replace_reason=True) == "drain-reason:gpu-7"
    assert key("requeue") == key("requeue", job="  ") == "requeue:gpu-7"
    assert key("requeue", job="slurm:12") == "requeue:gpu-7:slurm:12"
    assert key("resume") == "resume:gpu-7"
    assert key("alert") is None and key("webhook", url="http://x") is None and key("log") is None
