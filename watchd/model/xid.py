"""The ``xid`` kind: one Xid error of one GPU, from the kernel log (kmsg, log files) or from NVML's events.

:meth:`Xid.build` is the one builder of both paths: it adds the catalog's ``meaning``, ``bucket`` and
``action`` (:mod:`watchd.xid.catalog`). The two paths fill different fields: the kernel log knows the
process (``pid``, ``process``: null when the driver printed ``<unknown>`` or nothing), the whole line
(``raw``), what some messages decode to (Xid 154, NVLink5, the multi-line Xid 79) and, on a MIG GPU, the
GPU instance and compute instance the driver attributed the Xid to; NVML's event knows the GPU's index
(``gpu``), the MIG instance too, and gives no process (``pid``, ``process`` null).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from watchd.model.events import Scalar
from watchd.model.kinds import Attrs, keep_none
from watchd.xid.catalog import lookup

__all__ = ["KIND", "Xid"]

KIND = "xid"


@dataclass(frozen=True, slots=True, kw_only=True)
class Xid(Attrs):
    KIND: ClassVar[str] = KIND

    xid: int
    pci_bus_id: str | None = None  # normalized dddd:bb:dd.f, lower case; always sent by the agents
    uuid: str | None = keep_none()  # when the driver printed it (kernel log) or NVML knows it
    gpu: int | None = None  # GPU index on the node: NVML only
    # MIG: the GPU instance (GPU-I) and compute instance (GPU-CI) the kernel line attributed it to
    gpu_instance: int | None = None
    compute_instance: int | None = None
    pid: int | None = keep_none()
    process: str | None = keep_none()
    message: str | None = None  # the Xid's own text
    meaning: str | None = None  # from the catalog
    bucket: str | None = None  # the catalog's resolution bucket
    action: str | None = None  # the catalog's advice
    raw: str | None = None  # the whole kernel-log line
    # Xid 154: the recovery action, from -> to (codes) and the new one's name (RECOVERY_ACTIONS)
    recovery_action_from: int | None = None
    recovery_action_to: int | None = None
    recovery_action: str | None = None
    # Xids 144-150 (NVLink5), when decodable
    nvlink_subcode: str | None = None
    nvlink_severity: str | None = None  # fatal | nonfatal
    nvlink_link: int | None = None
    nvlink_intr_info: str | None = None
    # Xid 79 reported without a number (the multi-line form): the PCI device id it printed
    pci_device_id: str | None = None
    extra: Mapping[str, Scalar] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        *,
        xid: int,
        pci_bus_id: str,
        uuid: str | None = None,
        gpu: int | None = None,
        gpu_instance: int | None = None,
        compute_instance: int | None = None,
        pid: int | None = None,
        process: str | None = None,
        message: str,
        raw: str | None = None,
        details: Mapping[str, Scalar] | None = None,
    ) -> Xid:
        """An Xid with its catalog entry; ``details`` are what the message decoded to (the fields above, by
        name; any other key is carried in ``extra``, never replacing a declared field)."""
        info = lookup(xid)
        known: dict[str, Scalar] = {}
        extra: dict[str, Scalar] = {}
        for key, value in (details or {}).items():
            if key in _DETAILS:
                known[key] = value
            elif key not in _FIELDS:
                extra[key] = value
        return cls(
            xid=xid,
            pci_bus_id=pci_bus_id,
            uuid=uuid,
            gpu=gpu,
            gpu_instance=gpu_instance,
            compute_instance=compute_instance,
            pid=pid,
            process=process,
            message=message,
            meaning=info.meaning,
            bucket=info.bucket,
            action=info.action,
            raw=raw,
            extra=extra,
            **known,  # type: ignore[arg-type]
        )


_FIELDS = frozenset(Xid.fields())
_DETAILS = frozenset(Xid.fields()[Xid.fields().index("recovery_action_from") :])
