"""PyTorch's own device-generic test files, run on pjrt (``python -m torch_pjrt.tools.upstream``).

The files are not the project's: the runner takes a directory of them (a PyTorch
checkout's ``test/``, or ``../shared/upstream``) as an argument. Each file runs in
its own pytest process with only the device's instantiation
(``PYTORCH_TESTING_DEVICE_FOR_CUSTOM=privateuse1``); ``plugin.py`` supplies what the
files need from torch 2.13 (moved imports) and marks the tests the spec
(``spec.toml``) expects to fail or skip, each with its reason: an expected failure
that passes is reported as an unexpected pass, so the spec stays true.
"""
