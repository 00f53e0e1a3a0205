"""The upstream runner (python -m torch_pjrt.tools.upstream) on a small device-generic
file written here in PyTorch's style: only the device's instantiation runs, the spec's
expected failures are counted as such, an expected failure that passes and a failure
the spec does not name both fail the run, and the rates are what the counts say.
The runner's main() runs in this process (its pytest children are processes, as in a
real run); CI's upstream slice runs it as `python -m torch_pjrt.tools.upstream`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from torch_pjrt.tools.upstream.__main__ import main

FILE = textwrap.dedent('''
    import torch
    from torch.testing._internal.common_device_type import instantiate_device_type_tests
    from torch.testing._internal.common_utils import TestCase, run_tests


    class TestTiny(TestCase):
        def test_add(self, device):
            x = torch.arange(4.0, device=device)
            self.assertEqual((x + x).cpu(), torch.arange(4.0) * 2)

        def test_fails_everywhere(self, device):
            self.assertEqual(1, 2)

        def test_known_gap(self, device):
            self.assertEqual(torch.ones(2, device=device).sum().item(), {known})

        def test_skipped(self, device):
            self.skipTest("not for this device")


    instantiate_device_type_tests(TestTiny, globals())

    if __name__ == "__main__":
        run_tests()
''')


@pytest.fixture(autouse=True)
def _spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_PJRT_UPSTREAM_SPEC", str(tmp_path / "spec.toml"))


@pytest.fixture
def runner(capfd: pytest.CaptureFixture[str]):
    """runner(*args): the runner's exit status and everything it and its pytest children printed."""
    def run(*args: str) -> tuple[int, str]:
        capfd.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
        out, err = capfd.readouterr()
        return code, out + err
    return run


def _run(runner, tmp_path: Path, known: str, spec: str, *extra: str) -> tuple[int, str]:
    (tmp_path / "up").mkdir(exist_ok=True)
    (tmp_path / "up" / "test_tiny.py").write_text(FILE.replace("{known}", known))
    (tmp_path / "spec.toml").write_text(spec)
    return runner(str(tmp_path / "up"), "--report", str(tmp_path / "report.md"), *extra)


SPEC = '''["test_tiny.py"]
"TestTinyPRIVATEUSE1::test_fails_everywhere_pjrt" = { expect = "fail", cpu_too = true, reason = "1 is not 2" }
"TestTinyPRIVATEUSE1::test_known_gap_pjrt" = { expect = "fail", reason = "a gap under test" }
'''


def test_expected_failures_are_counted_and_the_run_passes(runner, tmp_path: Path) -> None:
    (tmp_path / "report.md").write_text("# an old report\n\n| old table |\n\n## Notes (by hand)\n\nkept.\n")
    code, out = _run(runner, tmp_path, "3.0", SPEC)
    assert code == 0, out
    assert ("test_tiny.py: 1 passed, 0 failed, 0 errors, 1 skipped, 2 expected failures (1 failing on CPU too), "
            "0 unexpected passes: 33.3%, 50.0% without the CPU's own failures") in out, out
    report = (tmp_path / "report.md").read_text()
    assert "| test_tiny.py | all | 1 | 0 | 0 | 1 | 2 (1) | 0 | 33.3% | 50.0% |" in report, report
    # The table is regenerated; a section of notes written by hand stays.
    assert "old table" not in report and report.endswith("\n## Notes (by hand)\n\nkept.\n"), report


def test_an_expected_failure_that_passes_fails_the_run(runner, tmp_path: Path) -> None:
    code, out = _run(runner, tmp_path, "2.0", SPEC)  # the "gap" is fixed: the spec must say so
    assert code == 1 and "XPASSED TestTinyPRIVATEUSE1::test_known_gap_pjrt" in out, out


def test_a_failure_the_spec_does_not_name_fails_the_run(runner, tmp_path: Path) -> None:
    spec = SPEC.replace('"TestTinyPRIVATEUSE1::test_known_gap_pjrt"', '"TestTinyPRIVATEUSE1::test_other_pjrt"')
    code, out = _run(runner, tmp_path, "3.0", spec)
    assert code == 1 and "FAILED TestTinyPRIVATEUSE1::test_known_gap_pjrt" in out, out


def test_a_spec_that_does_not_load_stops_the_run_before_any_test(runner, tmp_path: Path) -> None:
    (tmp_path / "report.md").write_text("| the last report |\n")
    code, out = _run(runner, tmp_path, "3.0", SPEC + '"TestTinyPRIVATEUSE1::test_add_pjrt" = { expect = "fail" \n')
    assert code == 2 and "spec.toml cannot be used: TOMLDecodeError" in out, out
    code, out = _run(runner, tmp_path, "3.0", SPEC.replace(', reason = "a gap under test"', ""))
    assert code == 2 and "needs expect = 'fail' or 'skip', and a reason" in out, out
    assert (tmp_path / "report.md").read_text() == "| the last report |\n"


def test_a_pattern_names_a_family_of_tests(runner, tmp_path: Path) -> None:
    spec = '''["test_tiny.py"]
"TestTinyPRIVATEUSE1::test_fails_everywhere_pjrt" = { expect = "fail", cpu_too = true, reason = "1 is not 2" }
"TestTinyPRIVATEUSE1::test_known_*" = { expect = "skip", reason = "a family the device lacks" }
'''
    code, out = _run(runner, tmp_path, "3.0", spec)
    assert code == 0, out
    assert "test_tiny.py: 1 passed, 0 failed, 0 errors, 2 skipped, 1 expected failures" in out, out


def test_a_non_strict_entry_counts_a_pass_as_a_pass(runner, tmp_path: Path) -> None:
    spec = SPEC.replace('reason = "a gap under test"', 'strict = false, reason = "depends on the CPU\'s kernels"')
    code, out = _run(runner, tmp_path, "2.0", spec)
    assert code == 0, out
    assert "test_tiny.py: 2 passed, 0 failed, 0 errors, 1 skipped, 1 expected failures" in out, out


def test_a_sample_runs_every_pjrt_expected_failure_and_says_it_is_a_sample(runner, tmp_path: Path) -> None:
    # Collection order: add, fails_everywhere, known_gap, skipped. A sample of 1 takes the
    # first test (add) and every failure the spec strictly expects on pjrt alone (known_gap), not
    # one that fails on the CPU too (fails_everywhere: the full run has it).
    code, out = _run(runner, tmp_path, "3.0", SPEC, "--sample", "1")
    report = (tmp_path / "report.md").read_text()
    assert code == 0 and "| test_tiny.py | sample of 2 / 4 | 1 | 0 | 0 | 0 | 1 (0) |" in report, out + report
    code, out = _run(runner, tmp_path, "3.0", SPEC, "--sample", "test_other.py=2")  # other files sampled: this one whole
    report = (tmp_path / "report.md").read_text()
    assert code == 0 and "| test_tiny.py | all | 1 | 0 | 0 | 1 | 2 (1) |" in report, out + report


def test_a_sample_leaves_entries_that_cannot_fail_the_run_to_the_full_run(tmp_path: Path) -> None:
    from torch_pjrt.tools.upstream import plugin

    spec = SPEC + ('"TestTinyPRIVATEUSE1::test_loose_pjrt" = { expect = "fail", strict = false, '
                   'reason = "depends on the CPU\'s kernels" }\n')
    (tmp_path / "spec.toml").write_text(spec)  # (the autouse fixture points the runner at it)
    ids = [f"TestTinyPRIVATEUSE1::test_{name}_pjrt" for name in ("add", "fails_everywhere", "known_gap", "loose")]
    # The first test (evenly spread, 1 of 4) and the strict failure on pjrt alone; not the one
    # failing on the CPU too, nor the non-strict one (a pass or a failure both leave the run green).
    assert plugin._sample(ids, 1, "test_tiny.py") == [ids[0], ids[2]]
    assert plugin._sample(ids, 4, "test_tiny.py") == ids  # every test where the sample is the whole file


def test_a_process_that_dies_is_charged_to_its_test_and_the_rest_still_run(runner, tmp_path: Path) -> None:
    crash = FILE.replace("    def test_skipped(self, device):", "    def test_zz_dies(self, device):\n"
                         "        import os\n        os._exit(7)\n\n    def test_skipped(self, device):")
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "test_tiny.py").write_text(crash.replace("{known}", "3.0"))
    (tmp_path / "spec.toml").write_text(SPEC)
    for extra in ([], ["--sample", "5"], ["--jobs", "2"]):
        code, out = runner(str(tmp_path / "up"), *extra)
        assert code == 1, out
        assert "ERROR TestTinyPRIVATEUSE1::test_zz_dies_pjrt: pytest ended with code 7 during this test" in out, out
        # test_skipped comes after the crash in collection order: a new process ran it
        assert "test_tiny.py: 1 passed, 0 failed, 1 errors, 1 skipped, 2 expected failures" in out, out


def test_jobs_split_a_file_and_a_resumed_run_runs_only_what_is_left(runner, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = _run(runner, tmp_path, "3.0", SPEC, "--jobs", "2", "--outcomes", str(tmp_path / "out"))
    assert code == 0 and "test_tiny.py: 1 passed, 0 failed, 0 errors, 1 skipped, 2 expected failures" in out, out
    assert len(list((tmp_path / "out").glob("test_tiny.py.*.jsonl"))) == 2
    # Resumed after the file changed: the tests with an outcome keep it (test_add is not run
    # again, though it would fail now); the new test runs.
    (tmp_path / "up" / "test_tiny.py").write_text(FILE.replace("{known}", "3.0").replace(
        "torch.arange(4.0) * 2)", "torch.arange(4.0) * 3)").replace(
        "    def test_skipped(self, device):", "    def test_new(self, device):\n        pass\n\n"
        "    def test_skipped(self, device):"))
    # (A relative --outcomes path: relative to where the runner starts, not to pytest's directory.)
    monkeypatch.chdir(tmp_path)
    code, out = runner(str(tmp_path / "up"), "--outcomes", "out", "--resume", "--report", str(tmp_path / "report.md"))
    assert code == 0 and "test_tiny.py: 2 passed, 0 failed, 0 errors, 1 skipped" in out, out
    assert "| test_tiny.py | all | 2 | 0 | 0 | 1 | 2 (1) |" in (tmp_path / "report.md").read_text()
    # Without --resume the directory's old outcomes are dropped and every test runs again.
    code, out = runner(str(tmp_path / "up"), "--outcomes", str(tmp_path / "out"))
    assert code == 1 and "FAILED TestTinyPRIVATEUSE1::test_add_pjrt" in out, out


def test_test_ops_runs_only_the_device_classes_the_runner_selects(runner, tmp_path: Path) -> None:
    # A file named test_ops.py gets the runner's -k selection (TestCommon's device tests,
    # TestMathBits); each process picks its share after that selection, so the tests it
    # leaves out are neither run nor counted.
    ops = FILE.replace("class TestTiny(TestCase):", "class TestCommon(TestCase):").replace(
        "instantiate_device_type_tests(TestTiny, globals())",
        "instantiate_device_type_tests(TestCommon, globals())\n\n\nclass TestOther(TestCase):\n"
        "    def test_out_elsewhere(self, device):\n        self.assertEqual(1, 2)\n\n\n"
        "instantiate_device_type_tests(TestOther, globals())").replace("def test_add(", "def test_out_add(")
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "test_ops.py").write_text(ops.replace("{known}", "2.0"))
    (tmp_path / "spec.toml").write_text("")
    code, out = runner(str(tmp_path / "up"), "--jobs", "2")
    assert code == 0 and "test_ops.py: 1 passed, 0 failed, 0 errors, 0 skipped" in out, out


def test_a_resumed_rerun_that_dies_is_charged_to_its_test(runner, tmp_path: Path) -> None:
    # The test failed in the first run; resumed, it runs again and kills its process. Its old
    # outcome must not stand in for the new one: the crash is charged to it.
    spec = SPEC.replace('"TestTinyPRIVATEUSE1::test_known_gap_pjrt"', '"TestTinyPRIVATEUSE1::test_other_pjrt"')
    code, out = _run(runner, tmp_path, "3.0", spec, "--outcomes", str(tmp_path / "out"))
    assert code == 1 and "FAILED TestTinyPRIVATEUSE1::test_known_gap_pjrt" in out, out
    (tmp_path / "up" / "test_tiny.py").write_text(FILE.replace("{known}", "3.0").replace(
        "    def test_known_gap(self, device):\n", "    def test_known_gap(self, device):\n        import os\n"
        "        os._exit(7)\n"))
    code, out = runner(str(tmp_path / "up"), "--outcomes", str(tmp_path / "out"), "--resume")
    assert code == 1, out
    assert "ERROR TestTinyPRIVATEUSE1::test_known_gap_pjrt: pytest ended with code 7 during this test" in out, out
    assert "test_tiny.py: 1 passed, 0 failed, 1 errors, 1 skipped, 1 expected failures" in out, out


def test_an_entry_can_be_kept_to_the_torch_releases_it_describes() -> None:
    from torch_pjrt.tools.upstream import spec

    assert spec.applies_to_torch("<2.14", "2.13.0+cpu") and not spec.applies_to_torch("<2.14", "2.14.1+cu130")
    assert spec.applies_to_torch(">=2.14", "2.14.1") and not spec.applies_to_torch(">=2.14", "2.13.0")
    with pytest.raises(ValueError, match="expected '<X.Y' or '>=X.Y'"):
        spec.applies_to_torch("==2.13", "2.13.0")
