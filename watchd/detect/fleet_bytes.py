"""What the fleet state's pieces cost in memory, as the byte budget counts them.

Estimates, not measurements: fixed costs per piece (measured with tracemalloc on CPython 3.11, see
tests/detect/test_fleet_bytes.py, which holds the estimate to within a factor of what really is allocated)
plus the text each piece keeps. They are deterministic, so the same inputs always evict the same nodes.
"""

from __future__ import annotations

NODE = 280  # a node's entries in the eviction order, the job topology and the per-node tables
GPU = 310  # a GPU's track, its key and its entries in the topology
WINDOW = 140  # one summary window kept in a GPU's history
HARDWARE_FIRST = 550  # the first hardware event of a node: its bounded queue
HARDWARE = 135  # each hardware event, plus the text of what it was
LOST = 140  # a GPU NVML called lost, in both of its indexes
SPIN = 180  # a GPU its agent says spins (nccl_spin): its key and entry
PCI = 150  # a PCI bus id mapped to a GPU index, plus its text
PCI_FIRST = 230  # a node's first PCI bus id: the node's map
RANK = 1850  # a training rank's track (with its bounded step-time history) and its topology entry


def node(name: str) -> int:
    return NODE + len(name)


def hardware(what: str, first: bool) -> int:
    return HARDWARE + len(what) + (HARDWARE_FIRST if first else 0)


def pci(bus_id: str, first: bool) -> int:
    return PCI + len(bus_id) + (PCI_FIRST if first else 0)


def rank(job: str) -> int:
    return RANK + len(job)
