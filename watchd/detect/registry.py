"""The detectors the engine runs, in order: one per signal, registered here and nowhere else.

The order is a precedence: a job has one condition at a time, and the first detector that sees one in a job
ends that job's turn in the cycle (a hung job is not also stalled on the host, nor a straggler).
"""

from __future__ import annotations

from watchd.detect.detector import AnyDetector
from watchd.detect.hang import HangDetector
from watchd.detect.host_stall import HostStallDetector
from watchd.detect.straggler import StragglerDetector

DETECTORS: tuple[AnyDetector, ...] = (HangDetector(), HostStallDetector(), StragglerDetector())
