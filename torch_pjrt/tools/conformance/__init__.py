"""OpInfo conformance harness: every op_db entry on pjrt vs the CPU, and the report.

    python -m torch_pjrt.tools.conformance --all --write-report
    python -m torch_pjrt.tools.conformance --ops 'nn.functional.*' --dtypes float32

Modules: settings (tolerances, caps, limits), opsel (which ops and dtypes), runner
(one op's samples in-process), compare, worker + supervisor (ops in subprocesses;
crashes and timeouts recorded), summary (statuses, rates, causes), report (md, json),
harness (the entry point used by the CLI and the tests).
"""
