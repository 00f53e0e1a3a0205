"""Plugin qualification: the battery a team runs before it trusts a PJRT plugin.

    python -m torch_pjrt.qualify [--plugin P] [--only SUBSTRING[,...]] [--json FILE]

Checks, each with a verdict (PASS, FAIL or SKIP with its reason):
- `kernels.*` and `buffers.*` (stress.py): float32 dots and convolutions
  across sizes against float64 with a worst-case rounding bound, pointwise
  transcendental ops against float64; in-place
  updates (donated buffers) then reads; views of updated buffers; buffers
  freed and reallocated; asynchronous work and synchronize. In strict and
  fused eager modes.
- `training.<family>.<optimizer>.<mode>` (differential.py, families.py):
  10 training steps of real model families with SGD, AdamW and fused AdamW in
  strict, fused and compiled modes; every step's loss, gradients, buffers and
  parameters against float64 replays of that step from the device's state,
  within a bound measured from float32's own distance to them.
- `collectives.*` (collectives.py): every collective of the `pjrt` process group over
  the plugin's devices as rank threads of one process (programs over the devices),
  values against the CPU, nothing through the host; between processes: reported as
  not supported yet (SKIP), not passed on the host path.
Exit status 1 when any check fails.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

import torch_pjrt

from . import collectives, differential, families, stress

MODES = ("strict", "fused", "compiled")
EAGER_MODES = ("strict", "fused")


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[], str]  # returns the detail of a pass; raises AssertionError (or anything) on failure
    skip_reason: str | None = None


@dataclass
class Verdict:
    name: str
    status: str  # PASS, FAIL, SKIP
    detail: str
    seconds: float


def _stress_check(name: str, fn: stress.StressCheck, mode: str) -> Check:
    def run() -> str:
        with torch_pjrt.eager_mode(mode):
            detail = fn(torch_pjrt.DEVICE_NAME)
        torch_pjrt.synchronize()
        return detail
    group = "kernels" if name in ("dots", "convolutions", "pointwise") else "buffers"
    return Check(f"{group}.{name}.{mode}", run)


def _training_check(family: str, optimizer: str, mode: str, steps: int) -> Check:
    def run() -> str:
        problem = families.problem(family, optimizer, steps)
        with torch_pjrt.fallback_mode("warn"):
            result = differential.run_on_device(problem, torch_pjrt.DEVICE_NAME, mode)
        if not result.passed:
            raise AssertionError(differential.describe(result))
        return differential.describe(result)
    return Check(f"training.{family}.{optimizer}.{mode}", run,
                 families.missing_requirement(families.FAMILIES[family]))


def _collective_checks() -> list[Check]:
    from .. import _plugins

    is_cpu = _plugins.is_cpu(_plugins.choose_plugin())
    count = getattr(torch, torch_pjrt.DEVICE_NAME).device_count()
    alone = None if is_cpu or count > 1 else f"this plugin has {count} device here: no group to run collectives over"
    return [Check("collectives.devices", lambda: collectives.devices_check(count, is_cpu), alone),
            Check("collectives.cross-process", collectives.cross_process_check)]


def all_checks(steps: int = 10) -> list[Check]:
    checks = [_stress_check(name, fn, mode) for name, fn in stress.STRESS_CHECKS.items() for mode in EAGER_MODES]
    checks += _collective_checks()
    checks += [_training_check(f, o, m, steps) for f in families.FAMILIES for o in families.OPTIMIZERS
               for m in MODES]
    return checks


def select(checks: list[Check], only: list[str]) -> list[Check]:
    if not only:
        return checks
    return [c for c in checks if any(part in c.name for part in only)]


def run_checks(checks: list[Check]) -> Iterator[Verdict]:
    for check in checks:
        if check.skip_reason:
            yield Verdict(check.name, "SKIP", check.skip_reason, 0.0)
            continue
        start = time.perf_counter()
        try:
            detail = check.run()
            status = "PASS"
        except collectives.Unsupported as e:  # observed while running: the plugin cannot
            status, detail = "SKIP", str(e)
        except Exception as e:  # noqa: BLE001  (any failure is the check's verdict)
            status = "FAIL"
            detail = f"{type(e).__name__}: {e}" if isinstance(e, AssertionError) else \
                f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        yield Verdict(check.name, status, detail, time.perf_counter() - start)


def plugin_summary() -> dict[str, object]:
    from .. import _plugins

    choice = _plugins.choose_plugin()
    info: dict[str, object] = {"plugin": choice.name, "path": choice.path,
                               "xla_options": dict(choice.compile_overrides)}
    info.update(torch_pjrt.platform())
    info["torch"] = torch.__version__
    return info


__all__ = ["Check", "Verdict", "all_checks", "plugin_summary", "run_checks", "select"]
