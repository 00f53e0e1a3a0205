"""The portability doctor: ``python -m torch_pjrt.doctor SCRIPT [ARGS...]``.

Runs a PyTorch script unmodified on pjrt (CUDA redirected) and grades how
ready it is to move, level by level (see ``__main__``'s help and
``docs/portability.md``)."""

from .assess import Options, Report, assess
from .findings import Finding
from .session import RunResult, run_script

__all__ = ["Finding", "Options", "Report", "RunResult", "assess", "run_script"]
