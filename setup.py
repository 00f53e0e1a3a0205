"""Builds the C++ extension (torch_pjrt._C) with CMake against the torch already installed.

    pip install --no-build-isolation .          # or: pip wheel --no-build-isolation .
    pip install --no-build-isolation -e .       # development (scripts/setup.sh)

Like every C++ extension of PyTorch, it must be built without build isolation: an isolated
build environment would hold no torch, or a different one, and the extension links against
torch's C++ ABI, which changes between minor releases. setuptools (which torch itself
requires) drives CMake here, so a venv that holds torch needs nothing more than cmake and a
compiler. The torch the extension was built for is written next to it (_build_info.json);
importing torch_pjrt under another torch refuses with a message saying to rebuild.

Environment: TORCH_PJRT_BUILD_DIR (CMake's build directory; default build/<python>-torch<version>),
TORCH_PJRT_BUILD_TESTS=1 (also the C++ unit tests, which need GoogleTest), TORCH_PJRT_OUTPUT_DIR
(where CMake writes the module; scripts/setup.sh: the checkout's torch_pjrt/), PJRT_INCLUDE_DIR
(the directory holding pjrt_c_api.h), MAX_JOBS (parallel compile jobs; default 2).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
# The PJRT C API header is taken at build time from the XLA CPU plugin package that ships it
# (the project never commits third-party headers).
HEADER_PACKAGE = "xla-cpu-pjrt==0.0.1"


def _torch() -> object:
    # An installed torch_pjrt (an older build, perhaps for another torch) must not load here.
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    try:
        import torch
    except ImportError:
        sys.exit("torch_pjrt: building needs torch installed in this environment (the extension is built against "
                 "it): install torch first, then `pip install --no-build-isolation .` (with build isolation, pip's "
                 "temporary environment has no torch)")
    return torch


def _pjrt_include_dir(build_dir: str) -> str:
    given = os.environ.get("PJRT_INCLUDE_DIR")
    if given:
        return given
    try:
        import xla_plugins.xla_cpu_pjrt as installed

        return os.path.join(list(installed.__path__)[0], "include")
    except ImportError:
        pass
    cached = os.path.join(build_dir, "pjrt-header")
    if os.path.isfile(os.path.join(cached, "pjrt_c_api.h")):
        return cached
    print(f"torch_pjrt: fetching pjrt_c_api.h from {HEADER_PACKAGE} (set PJRT_INCLUDE_DIR to use another copy)")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        HEADER_PACKAGE, "-d", tmp], check=True)
        wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith("/pjrt_c_api.h"))
            os.makedirs(cached, exist_ok=True)
            with z.open(member) as src, open(os.path.join(cached, "pjrt_c_api.h"), "wb") as dst:
                shutil.copyfileobj(src, dst)
    return cached


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        torch = _torch()
        if shutil.which("cmake") is None:
            sys.exit("torch_pjrt: building needs CMake >= 3.22 on PATH (pip install cmake, or your system's package)")
        tag = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}"
        build_dir = os.path.abspath(os.environ.get("TORCH_PJRT_BUILD_DIR") or os.path.join(ROOT, "build", tag))
        output_dir = os.environ.get("TORCH_PJRT_OUTPUT_DIR") or os.path.join(build_dir, "module")
        os.makedirs(build_dir, exist_ok=True)
        with_tests = os.environ.get("TORCH_PJRT_BUILD_TESTS", "0") == "1"
        configure = ["cmake", "-S", ROOT, "-B", build_dir, f"-DPython3_EXECUTABLE={sys.executable}",
                     f"-DPJRT_INCLUDE_DIR={_pjrt_include_dir(build_dir)}", f"-DTORCH_PJRT_OUTPUT_DIR={output_dir}",
                     f"-DTORCH_PJRT_BUILD_TESTS={'ON' if with_tests else 'OFF'}"]
        if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")) and shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
        jobs = os.environ.get("MAX_JOBS", "2")
        subprocess.run(["cmake", "--build", build_dir, "-j", jobs, *([] if with_tests else ["--target", "_C"])],
                       check=True)
        built = glob.glob(os.path.join(output_dir, "_C*.so"))
        if len(built) != 1:
            sys.exit(f"torch_pjrt: expected one _C*.so in {output_dir}, found {built}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not (os.path.exists(target) and os.path.samefile(built[0], target)):
            # Replaced, not overwritten: a running process may have the old module mapped.
            shutil.copyfile(built[0], target + ".tmp")
            os.replace(target + ".tmp", target)
        info = {"torch": torch.__version__, "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
                "python": f"{sys.version_info.major}.{sys.version_info.minor}"}
        # Beside the module: in the wheel, or in the source tree for an editable install.
        editable = self.inplace or getattr(self, "editable_mode", False)
        package_dir = os.path.join(ROOT, "torch_pjrt") if editable else os.path.dirname(target)
        with open(os.path.join(package_dir, "_build_info.json"), "w") as f:
            json.dump(info, f, indent=1)
            f.write("\n")


setup(ext_modules=[Extension("torch_pjrt._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
