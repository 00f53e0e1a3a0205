"""pytest plugin loaded into each upstream file's run (``-p torch_pjrt.tools.upstream.plugin``).

- Supplies the names some upstream files import from where torch 2.13 no longer has
  them (test_ops' skip/xfail/skipOps, test_binary_ufuncs' binary_ufuncs_and_refs), and numpy 1's ``msort`` (a reference numpy 2 removed), without editing the files.
- Picks the tests this process runs from its own collection: the runner's sample, a
  resumed run's remainder, one job's share (see _share).
- Marks the spec's entries for this file: ``fail`` as a strict xfail (a pass is an
  unexpected pass, a failure of the run), ``skip`` as a skip, each with its reason.
- Lets TestCommon.test_compare_cpu (upstream: CUDA and XPU only) run on the device,
  through the testing framework's own per-instance switch.
- Counts a test the file marks expectedFailure for every device (unittest's
  "Unexpected success") as passed when it passes on pjrt.
- Writes every test's outcome to ``$TORCH_PJRT_UPSTREAM_OUTCOMES`` (JSON lines).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from .spec import lookup


def _supply_moved_op_names() -> None:
    # test_ops.py imports skip, xfail and skipOps from common_methods_invocations, and
    # calls skipOps(class name, test name, entries); torch 2.13 keeps them in
    # common_device_type, where skipOps takes only the entries (it reads the names
    # from the decorated function).
    import torch.testing._internal.common_device_type as cdt
    import torch.testing._internal.common_methods_invocations as cmi

    for name in ("skip", "xfail"):
        if not hasattr(cmi, name):
            setattr(cmi, name, getattr(cdt, name))
    # test_binary_ufuncs.py imports binary_ufuncs_and_refs; torch 2.13's binary_ufuncs is
    # taken from op_db and python_ref_db together, so it is the same list.
    if not hasattr(cmi, "binary_ufuncs_and_refs"):
        cmi.binary_ufuncs_and_refs = tuple(cmi.binary_ufuncs)
    if not hasattr(cmi, "skipOps"):
        def skip_ops(*args: Any) -> Any:
            return cdt.skipOps(args[-1])

        cmi.skipOps = skip_ops


def _supply_numpy_msort() -> None:
    # test_sort_and_select's reference for torch.msort is numpy.msort, which numpy 2
    # removed; numpy 1 defined it as a sort along the first axis.
    import numpy

    if not hasattr(numpy, "msort"):
        def msort(a: Any) -> Any:
            return numpy.sort(a, axis=0)

        numpy.msort = msort


def _reads_op_database(paths: list[str]) -> bool:
    """Whether a file to run imports from common_methods_invocations (importing it takes
    seconds: a file that does not, such as the runner's own tests' small files, skips it)."""
    for path in paths:
        try:
            with open(path.split("::")[0]) as f:
                if "common_methods_invocations" in f.read():
                    return True
        except OSError:  # not a file (an option's value, a directory): play safe
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    if _reads_op_database([a for a in config.args if not a.startswith("-")]):
        _supply_moved_op_names()
    _supply_numpy_msort()


def _sample(ids: list[str], n: int, file: str) -> list[str]:
    """A fixed, evenly spread sample of about n tests, plus every test the spec strictly expects
    to fail on pjrt alone, so that one that starts passing turns the run red. The full run still
    runs the others: one that fails on the CPU as well tests torch, not the device, and a
    non-strict entry (its outcome depends on the CPU's kernels) cannot fail a run either way."""
    step = max(1, len(ids) // n)
    return [t for i, t in enumerate(ids) if i % step == 0 or _strictly_expected_to_fail_on_pjrt_alone(file, t)]


def _strictly_expected_to_fail_on_pjrt_alone(file: str, test: str) -> bool:
    entry = lookup(file, test)
    return entry is not None and entry.expect == "fail" and entry.strict and not entry.cpu_too


def _share(items: list[pytest.Item], file: str) -> set[str] | None:
    """The tests this process runs, as the runner asked (None: all collected).

    TORCH_PJRT_UPSTREAM_SHARE names the runner's request (JSON): the sample size, the
    tests a resumed run has done, this job's index and the number of jobs. The tests are
    chosen here, from this process's own collection, so the runner collects no file
    beforehand; the answer (the file's test count, the tests wanted, this job's share)
    lets the runner find what a process that died left unrun.
    TORCH_PJRT_UPSTREAM_ONLY names a file of test ids: the rest of a share after a crash."""
    ids = [i.nodeid.split("::", 1)[1] for i in items]
    only = os.environ.get("TORCH_PJRT_UPSTREAM_ONLY")
    if only:
        with open(only) as f:
            return set(f.read().split())
    request_path = os.environ.get("TORCH_PJRT_UPSTREAM_SHARE")
    if not request_path:
        return None
    with open(request_path) as f:
        request = json.load(f)
    wanted = _sample(ids, request["sample"], file) if request["sample"] else ids
    done = set(request["done"])
    mine = [t for t in wanted if t not in done][request["job"]::request["jobs"]]
    with open(request["answer"], "w") as f:
        json.dump({"collected": len(ids), "wanted": wanted, "mine": mine}, f)
    return set(mine)


@pytest.hookimpl(trylast=True)  # after -k has deselected: the share is chosen from what the run selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    file = os.path.basename(str(items[0].fspath)) if items else ""
    share = _share(items, file)
    if share is not None:
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid.split("::", 1)[1] not in share])
        items[:] = [i for i in items if i.nodeid.split("::", 1)[1] in share]
    for item in items:
        entry = lookup(file, item.nodeid.split("::", 1)[1])
        if entry is None:
            continue
        if entry.expect == "skip":
            item.add_marker(pytest.mark.skip(reason=f"spec: {entry.reason}"))
        else:
            item.add_marker(pytest.mark.xfail(reason=f"spec: {entry.reason}", strict=entry.strict, run=True))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if item.name.startswith("test_compare_cpu"):
        case = getattr(item, "_testcase", None) or getattr(item, "instance", None)
        if case is not None:
            case.bypass_device_restrictions = True


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("TORCH_PJRT_UPSTREAM_OUTCOMES")
    if not path:
        return
    outcome: str | None = None
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.failed and str(report.longrepr).startswith("[XPASS(strict)]"):
            outcome = "xpassed"  # pytest reports a strict xfail's pass as a failure
        else:
            outcome = report.outcome
    elif report.when == "setup" and report.outcome != "passed":
        outcome = "skipped" if report.skipped else "error"
    elif report.when == "teardown" and report.outcome == "failed":
        outcome = "error"
    if outcome is None:
        return
    if outcome == "failed" and "Unexpected success" in str(report.longrepr):
        # unittest.expectedFailure marks the file sets for every device (an OpInfo's
        # "CUDA differs from the CPU here"): passing means pjrt matched the CPU, a pass.
        outcome = "passed"
    file, _, test = report.nodeid.partition("::")
    entry = lookup(os.path.basename(file), test)
    if outcome == "xpassed" and entry is not None and not entry.strict:
        outcome = "passed"
    message: Any = ""
    if report.outcome != "passed" and report.longrepr is not None:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
            message = report.longrepr[2]
    with open(path, "a") as f:
        f.write(json.dumps({"test": report.nodeid.split("::", 1)[1], "outcome": outcome,
                            "message": str(message).splitlines()[0][:300] if message else "",
                            "commit": os.environ.get("TORCH_PJRT_UPSTREAM_COMMIT", "unknown"),
                            "time": time.time()}) + "\n")
