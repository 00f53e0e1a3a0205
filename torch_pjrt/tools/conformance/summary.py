"""From per-sample records to per-op statuses, pass rates, headline figures and failure causes."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from .records import ERROR, FAIL, PASS, PASS_BY_FLOAT64, PHASES, SKIP, OpRun, SampleResult

# Statuses, in order of precedence (the first that applies).
CRASHED = "crashed"
TIMEOUT = "timeout"
NOT_RUN = "not run"
FAILS = "fails"
NATIVE = "native"
PARTLY = "partly native"
FALLS_BACK = "falls back"
STATUSES = (NATIVE, PARTLY, FALLS_BACK, FAILS, CRASHED, TIMEOUT, NOT_RUN)

STATUS_DEFINITIONS: dict[str, str] = {
    CRASHED: "the worker process died (signal, abort or exit) while running one of the op's samples; "
             "always a bug. The remaining dtypes were still run in a fresh worker.",
    TIMEOUT: "the op exceeded the per-op time limit; the worker was killed.",
    NOT_RUN: "no sample ran: the op claims none of the selected dtypes on the CPU, or it has no sample inputs.",
    FAILS: "no forward sample passed (every one raised on pjrt or differed from the CPU).",
    NATIVE: "at least one forward sample passed, and no phase of any sample (forward, backward, "
            "non-contiguous, out=) used the CPU fallback.",
    PARTLY: "at least one forward sample passed; some phase runs used the CPU fallback and some did not.",
    FALLS_BACK: "at least one forward sample passed; every phase run used the CPU fallback at least once.",
}

OUTCOME_DEFINITIONS: dict[str, str] = {
    PASS: "ran on pjrt and matched the CPU result (values within tolerance, shapes, dtypes, structure; "
          "properties only for random ops). A float32 (complex64) result whose values miss the CPU's "
          "float32 ones also passes where, element by element, it is at least as close to the CPU's result "
          "on float64 (complex128) copies of the inputs as the CPU's float32 result is, within the same "
          "tolerance; this judges only elements where both CPU results are finite and within 100 "
          "tolerances of each other, and never ops defined by their dtype (settings.NOT_JUDGED_BY_FLOAT64). "
          "Such passes are listed among the problems with their mismatch and counted in the headline "
          "(judged_by_float64).",
    FAIL: "ran on pjrt, but the result differs from the CPU result",
    ERROR: "raised on pjrt (including deferred errors surfaced at the next synchronization) "
           "while the CPU reference ran",
    SKIP: "not counted: the CPU reference itself raised, or the sample had nothing to differentiate",
}

SHORT_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64", "bool": "bool"}


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        """Samples that ran (skips are not counted)."""
        return self.passed + self.failed + self.errors

    def add(self, outcome: str) -> None:
        if outcome == PASS:
            self.passed += 1
        elif outcome == FAIL:
            self.failed += 1
        elif outcome == ERROR:
            self.errors += 1
        else:
            self.skipped += 1

    def as_list(self) -> list[int]:
        return [self.passed, self.failed, self.errors, self.skipped]


COUNT_FIELDS = ("passed", "failed", "errors", "skipped")


@dataclass
class OpSummary:
    op: str
    status: str
    properties_only: bool
    counts: dict[str, Counts]  # phase -> all dtypes
    counts_float32: dict[str, Counts]  # phase -> float32 only
    counts_by_dtype: dict[str, dict[str, Counts]]  # dtype -> phase -> counts
    dtypes_claimed: list[str]
    dtypes_run: list[str]
    dtypes_clean: list[str]  # dtypes whose every forward sample passed
    fallback_ops: list[str]  # ATen ops that ran on the CPU fallback, most frequent first
    runs_with_fallback: int
    runs: int
    first_failure: dict[str, Any] | None
    aborts: list[dict[str, Any]]
    notes: list[str]
    seconds: float
    problems: list[SampleResult] = field(default_factory=list)  # every non-pass result, and passes judged by float64

    def to_json(self) -> dict[str, Any]:
        """Compact: counts are [passed, failed, errors, skipped] (COUNT_FIELDS); a problem is
        [dtype, phase, index, outcome, message, fallbacks], its message "" when the same as the
        previous problem's."""
        problems = []
        last = None
        for r in self.problems:
            problems.append([r.dtype, r.phase, r.index, r.outcome, "" if r.message == last else r.message, r.fallbacks])
            last = r.message
        return {
            "status": self.status,
            "properties_only": self.properties_only,
            "counts": {p: c.as_list() for p, c in self.counts.items() if c.total or c.skipped},
            "counts_by_dtype": {d: {p: c.as_list() for p, c in ph.items() if c.total or c.skipped}
                                for d, ph in self.counts_by_dtype.items()},
            "dtypes_claimed": self.dtypes_claimed,
            "dtypes_run": self.dtypes_run,
            "dtypes_clean": self.dtypes_clean,
            "fallback_ops": self.fallback_ops,
            "runs_with_fallback": self.runs_with_fallback,
            "runs": self.runs,
            "first_failure": self.first_failure,
            "aborts": self.aborts,
            "notes": self.notes,
            "seconds": round(self.seconds, 2),
            "problems": problems,
        }


def summarize(run: OpRun) -> OpSummary:
    counts = {p: Counts() for p in PHASES}
    counts_f32 = {p: Counts() for p in PHASES}
    by_dtype: dict[str, dict[str, Counts]] = defaultdict(lambda: {p: Counts() for p in PHASES})
    fallback_counter: Counter[str] = Counter()
    runs = runs_fb = 0
    first: SampleResult | None = None
    problems = []
    for r in run.results:
        if r.phase not in counts:
            continue
        counts[r.phase].add(r.outcome)
        by_dtype[r.dtype][r.phase].add(r.outcome)
        if r.dtype == "float32":
            counts_f32[r.phase].add(r.outcome)
        if r.outcome != SKIP:
            runs += 1
            if r.fallbacks:
                runs_fb += 1
        fallback_counter.update(r.fallbacks)
        if r.outcome != PASS or r.message.startswith(PASS_BY_FLOAT64):
            problems.append(r)
        if r.outcome in (FAIL, ERROR) and first is None:
            first = r
    aborts = [a.to_json() for a in run.aborts]
    fwd = counts["forward"]
    if any(a.kind == "crashed" for a in run.aborts):
        status = CRASHED
    elif run.aborts:
        status = TIMEOUT
    elif runs == 0:
        status = NOT_RUN
    elif fwd.passed == 0:
        status = FAILS
    elif runs_fb == 0:
        status = NATIVE
    elif runs_fb < runs:
        status = PARTLY
    else:
        status = FALLS_BACK
    first_failure = None
    if run.aborts:
        a = run.aborts[0]
        first_failure = {"dtype": a.dtype, "phase": a.phase, "index": a.index, "outcome": a.kind,
                         "message": f"{a.kind}: {a.detail}"}
    elif first is not None:
        first_failure = {"dtype": first.dtype, "phase": first.phase, "index": first.index, "outcome": first.outcome,
                         "message": first.message}
    clean = [d for d in run.meta.dtypes_run
             if d in by_dtype and by_dtype[d]["forward"].total > 0
             and by_dtype[d]["forward"].passed == by_dtype[d]["forward"].total]
    return OpSummary(
        op=run.meta.op,
        status=status,
        properties_only=run.meta.properties_only,
        counts=counts,
        counts_float32=counts_f32,
        counts_by_dtype=dict(by_dtype),
        dtypes_claimed=run.meta.dtypes_claimed,
        dtypes_run=run.meta.dtypes_run,
        dtypes_clean=clean,
        fallback_ops=[k for k, _ in fallback_counter.most_common()],
        runs_with_fallback=runs_fb,
        runs=runs,
        first_failure=first_failure,
        aborts=aborts,
        notes=run.meta.notes,
        seconds=run.seconds,
        problems=problems,
    )


# -- failure causes ---------------------------------------------------------------------------

_VALUES = re.compile(r"\[(\w+)\]: Tensor-likes are not (close|equal)")
_CAUSE_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Scalars are not (close|equal)"), "scalar results differ from the CPU"),
    (re.compile(r"structure differs"), "result structure differs from the CPU"),
    (re.compile(r"requires grad on the CPU but not on pjrt"), "output does not require grad on pjrt"),
]


def normalize_cause(message: str) -> str:
    """A failure message with the specifics (op names, numbers, shapes, positions) taken out."""
    values = _VALUES.search(message)
    if values:
        if re.search(r"Greatest absolute difference: nan", message):
            return f"NaN where the CPU has a number, or the reverse ({values.group(1)})"
        if values.group(2) == "equal":
            return f"values differ from the CPU ({values.group(1)}, compared exactly)"
        return f"values differ from the CPU beyond tolerance ({values.group(1)})"
    for pattern, cause in _CAUSE_RULES:
        if pattern.search(message):
            return cause
    m = message
    m = re.sub(r"^(output|grad|out)( \d+)?: ", "", m)
    m = re.sub(r"^forward raised on pjrt: ", "", m)
    m = re.sub(r"aten::[\w.]+", "aten::<op>", m)
    m = re.sub(r"-:\d+:\d+: ", "", m)
    m = re.sub(r"\(Triggered internally at [^)]*\)", "", m)
    m = re.sub(r"'[^']*'", "'…'", m)
    m = re.sub(r"\[[^\]]*\]", "[…]", m)
    m = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "N", m)
    m = re.sub(r"\s+", " ", m).strip()
    # The first sentence is the cause; what follows is usually context.
    m = re.split(r"(?<=[a-z)])\. |; ", m, maxsplit=1)[0]
    return m[:160]


def failure_causes(summaries: list[OpSummary]) -> list[dict[str, Any]]:
    """Causes ranked by the number of ops whose first failure they are; sample counts beside."""
    by_first: dict[str, list[str]] = defaultdict(list)
    samples: Counter[str] = Counter()
    phases: dict[str, Counter[str]] = defaultdict(Counter)
    examples: dict[str, str] = {}
    for s in summaries:
        if s.first_failure is not None:
            cause = normalize_cause(s.first_failure["message"])
            by_first[cause].append(s.op)
            examples.setdefault(cause, s.first_failure["message"])
        for r in s.problems:
            if r.outcome in (FAIL, ERROR):
                cause = normalize_cause(r.message)
                samples[cause] += 1
                phases[cause][r.phase] += 1
                examples.setdefault(cause, r.message)
    causes = set(by_first) | set(samples)
    ranked = sorted(causes, key=lambda c: (-len(by_first.get(c, [])), -samples[c], c))
    return [
        {"cause": c, "ops": len(by_first.get(c, [])), "op_names": by_first.get(c, []), "failing_sample_runs": samples[c],
         "phases": dict(phases[c]), "example": examples[c]}
        for c in ranked
    ]


# -- headline figures ---------------------------------------------------------------------------


def distinct_operator(name: str) -> str:
    """aten::add_.Tensor -> aten::add; aten::__and__.Scalar -> aten::__and__."""
    base = name.split(".", 1)[0]
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
    return base


def dispatcher_native_ops() -> dict[str, Any]:
    regs = sorted(torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"))
    aten = [r for r in regs if r.startswith("aten::")]
    distinct = sorted({distinct_operator(r) for r in aten})
    return {"registrations": len(regs), "aten_registrations": len(aten), "distinct_aten_operators": len(distinct),
            "distinct_aten_operator_names": distinct}


def pass_rate(summaries: list[OpSummary], phase: str, float32_only: bool = True) -> dict[str, Any]:
    passed = total = judged = 0
    for s in summaries:
        c = (s.counts_float32 if float32_only else s.counts)[phase]
        passed += c.passed
        total += c.total
        judged += sum(1 for r in s.problems if r.phase == phase and r.outcome == PASS
                      and (not float32_only or r.dtype == "float32"))
    return {"passed": passed, "total": total, "rate": (passed / total) if total else None, "judged_by_float64": judged}
