"""Plain records exchanged between the worker, the supervisor and the report (JSON-able)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Phases of one sample. "samples" is not a phase of a sample: it records a failure to
# generate the op's sample inputs for a dtype.
PHASES: tuple[str, ...] = ("forward", "backward", "noncontiguous", "out")

# Outcomes of one phase of one sample.
PASS = "pass"  # ran on pjrt and matched the CPU (values, or properties for random ops)
FAIL = "fail"  # ran, but values, shapes, dtypes or structure differ from the CPU
ERROR = "error"  # raised on pjrt while the CPU reference ran
SKIP = "skip"  # not applicable: the CPU reference itself raised, or nothing to differentiate

# The message of a float32 (complex64) pass that differs from the CPU's float32 result beyond
# the tolerance but is at least as close to the CPU's float64 result; the mismatch follows it.
PASS_BY_FLOAT64 = "as close to the CPU's float64 result as the CPU's float32 result is"


@dataclass
class SampleResult:
    op: str
    dtype: str
    phase: str
    index: int  # position of the sample in the op's reference inputs for this dtype
    outcome: str
    message: str = ""
    fallbacks: list[str] = field(default_factory=list)  # ATen ops that ran on the CPU fallback
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> SampleResult:
        return SampleResult(**d)


@dataclass
class OpInfoMeta:
    """What the harness learned about an op, apart from its samples."""

    op: str
    properties_only: bool = False
    supports_autograd: bool = False
    supports_out: bool = False
    dtypes_claimed: list[str] = field(default_factory=list)  # of settings.DTYPES, claimed on the CPU
    dtypes_run: list[str] = field(default_factory=list)
    samples_available: dict[str, int] = field(default_factory=dict)  # dtype -> pool size (capped)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> OpInfoMeta:
        return OpInfoMeta(**d)


@dataclass
class Abort:
    """The worker died (signal or exit) or exceeded the op's time limit while running an op."""

    op: str
    kind: str  # "crashed" or "timeout"
    detail: str  # exit signal / code, or the limit
    dtype: str = ""
    phase: str = ""
    index: int = -1
    log_tail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Abort:
        return Abort(**d)


@dataclass
class OpRun:
    """Everything recorded for one op."""

    meta: OpInfoMeta
    results: list[SampleResult] = field(default_factory=list)
    aborts: list[Abort] = field(default_factory=list)
    seconds: float = 0.0
