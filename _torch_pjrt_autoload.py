"""torch's device-backend autoload entry point for torch_pjrt, and its build check.

`import torch` calls `autoload()` (entry point group "torch.backends"). It lives outside the
torch_pjrt package so that it can check, before importing the package, that the installed
torch is the one the extension was built for: under another minor release of torch the
extension's C++ symbols do not match, and a failing autoload would break `import torch`
itself. On a mismatch the device is left unregistered with a warning; `import torch_pjrt`
then raises the same message.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings


def mismatch(built: str, installed: str) -> str | None:
    """Why an extension built against torch `built` cannot load under torch `installed`
    (None: it can). The C++ ABI holds within a minor release (2.13.0 and 2.13.1, CPU and
    CUDA builds alike), not across them."""
    if built.split("+")[0].split(".")[:2] != installed.split("+")[0].split(".")[:2]:
        return (f"torch_pjrt was built against torch {built}, but torch {installed} is installed: PyTorch's C++ "
                "ABI changes between minor releases. Rebuild it against this torch: pip install "
                "--no-build-isolation --force-reinstall --no-deps torch_pjrt (or `.` from a checkout)")
    return None


def build_mismatch() -> str | None:
    """Why the built extension cannot load under the installed torch (None: it can)."""
    import torch

    spec = importlib.util.find_spec("torch_pjrt")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "_build_info.json")
    try:
        with open(path) as f:
            built = json.load(f)["torch"]
    except (OSError, ValueError, KeyError):
        return None  # a build without the record (a hand-run CMake build): nothing to compare
    return mismatch(built, torch.__version__)


def autoload() -> None:
    problem = build_mismatch()
    if problem is not None:
        warnings.warn(problem + "; the pjrt device is not registered", RuntimeWarning, stacklevel=2)
        return
    import torch_pjrt  # noqa: F401  (importing it registers the device)
