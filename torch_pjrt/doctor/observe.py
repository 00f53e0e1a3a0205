"""Watching a script run: one TorchFunctionMode (device redirection, host
syncs, attention outside SDPA, losses), step boundaries from the optimizer and
CPU fallbacks with the user's line (Dynamo's graph breaks and recompiles:
dynamo_watch.py)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import torch_pjrt
from torch_pjrt import _C

from .findings import Finding, Findings, user_site
from .redirect import Redirect

# Calls that make the host wait for the device, and data-dependent shapes.
_SYNCS = {
    torch.Tensor.item: ".item()", torch.Tensor.tolist: ".tolist()", torch.Tensor.numpy: ".numpy()",
    torch.Tensor.__bool__: "bool(tensor)", torch.Tensor.__float__: "float(tensor)",
    torch.Tensor.__int__: "int(tensor)", torch.Tensor.__index__: "tensor as an index",
    torch.Tensor.__repr__: "printing a tensor", torch.Tensor.__format__: "formatting a tensor",
    torch.Tensor.cpu: ".cpu()",
}
_DATA_DEPENDENT = {
    torch.nonzero: "nonzero", torch.Tensor.nonzero: "nonzero", torch.masked_select: "masked_select",
    torch.Tensor.masked_select: "masked_select", torch.unique: "unique", torch.Tensor.unique: "unique",
    torch.argwhere: "argwhere",
}
_SOFTMAX = {torch.softmax, torch.Tensor.softmax, F.softmax}


def _on_device(value: Any, device_type: str) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == device_type


@dataclass
class Step:
    seconds: float
    host_syncs: int
    compiles: int
    fused_graphs: int
    h2d_bytes: int
    d2h_bytes: int
    fallbacks: int


@dataclass
class RunRecord:
    steps: list[Step] = field(default_factory=list)
    step_source: str = "optimizer.step()"
    losses: list[torch.Tensor] = field(default_factory=list)
    sync_sites: dict[tuple[str | None, int | None, str], int] = field(default_factory=dict)
    sdpa_calls: int = 0
    manual_attention: dict[tuple[str | None, int | None], int] = field(default_factory=dict)
    first_input: tuple[str, tuple[int, ...]] | None = None  # dtype kind and shape of the model's first input
    start: float = 0.0
    first_step_end: float | None = None


class DoctorMode(TorchFunctionMode):
    def __init__(self, redirect: Redirect | None, record: RunRecord, device_type: str) -> None:
        super().__init__()
        self.redirect = redirect
        self.record = record
        self.device_type = device_type

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.redirect is not None:
            func, args, kwargs = self.redirect.torch_function(func, args, kwargs)
        if not torch.compiler.is_compiling():
            self._observe(func, args)
        return func(*args, **kwargs)

    def _observe(self, func: Any, args: tuple) -> None:
        rec = self.record
        if func is torch.Tensor.backward and args and args[0].numel() == 1:
            loss = self.redirect.unscaled.pop(id(args[0]), args[0]) if self.redirect is not None else args[0]
            if self.device_type == "cpu" or _on_device(loss, self.device_type):  # not a CPU reference's
                rec.losses.append(loss.detach())
            return
        what = _SYNCS.get(func) or _DATA_DEPENDENT.get(func)
        if what is not None and args and _on_device(args[0], self.device_type):
            if what == ".cpu()" and args[0].numel() > 1:
                what = ".cpu() of a tensor"
            file, line = user_site(3)
            key = (file, line, what)
            rec.sync_sites[key] = rec.sync_sites.get(key, 0) + 1
        elif func is F.scaled_dot_product_attention:
            rec.sdpa_calls += 1
        elif rec.first_input is None and func in (F.embedding, F.linear, F.conv1d, F.conv2d, F.conv3d) and args:
            # Throughput units: token ids of the first embedding, else the batch of the first layer.
            x = args[0]
            if func is F.embedding and isinstance(x, torch.Tensor) and x.dim() >= 2:
                rec.first_input = ("tokens", tuple(x.shape))
            elif func is not F.embedding and isinstance(x, torch.Tensor) and x.dim() >= 2:
                rec.first_input = ("samples", tuple(x.shape))
        elif func in _SOFTMAX and args and isinstance(args[0], torch.Tensor):
            x = args[0]
            if x.dim() >= 3 and x.shape[-1] == x.shape[-2] and x.shape[-1] > 1:  # a square score matrix
                site = user_site(3)
                rec.manual_attention[site] = rec.manual_attention.get(site, 0) + 1


class StepWatch:
    """Step boundaries: each optimizer step (else each backward) ends a step;
    the doctor synchronizes there (its own syncs are not counted as the script's)."""

    def __init__(self, record: RunRecord, on_device: bool, progress: bool) -> None:
        self.record = record
        self.on_device = on_device
        self.progress = progress
        self._handle: Any = None
        self._last = 0.0
        self._last_metrics: dict[str, Any] = {}
        self._own_syncs = 0

    def _metrics(self) -> dict[str, Any]:
        return _C._metrics() if self.on_device else {}

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self.record.start = self._last = time.perf_counter()
        self._last_metrics = self._metrics()
        self._handle = register_optimizer_step_post_hook(self._after_step)

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
        if self.progress:
            sys.stderr.write("\n")

    def _after_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        # A script may also train on the CPU (a reference run): only steps of
        # the device under test are its steps.
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if not params or (params[0].device.type == "cpu") == self.on_device:
            return
        self.end_step()

    def end_step(self) -> None:
        if self.on_device:
            torch_pjrt.synchronize()
            self._own_syncs += 1
        now = time.perf_counter()
        m = self._metrics()
        before = self._last_metrics

        def delta(key: str) -> int:
            return int(m.get(key, 0)) - int(before.get(key, 0))

        fallbacks = sum(m.get("fallbacks", {}).values()) - sum(before.get("fallbacks", {}).values())
        self.record.steps.append(Step(now - self._last, max(0, delta("host_syncs") - 1) if self.on_device else 0,
                                      delta("compiles"), delta("graphs"), delta("host_to_device_bytes"),
                                      delta("device_to_host_bytes"), fallbacks))
        if self.record.first_step_end is None:
            self.record.first_step_end = now
        self._last, self._last_metrics = now, self._metrics()
        if self.progress:
            n = len(self.record.steps)
            bar = "#" * min(30, n) + "." * max(0, 30 - n)
            sys.stderr.write(f"\r[doctor] [{bar}] step {n}  {self.record.steps[-1].seconds * 1e3:8.1f} ms")
            sys.stderr.flush()


class FallbackWatch:
    """Every CPU fallback with the user's line (TORCH_PJRT_FALLBACK=log's hook)."""

    def __init__(self, findings: Findings) -> None:
        self.findings = findings
        self._mode = "warn"

    def install(self) -> None:
        self._mode = _C._get_fallback_mode()
        if self._mode != "error":  # a script that forbids fallbacks keeps forbidding them
            _C._set_fallback_mode("log")
        _C._set_fallback_logger(self._log)

    def _log(self, op: str) -> None:
        file, line = user_site(2)
        where = "" if file else " (in backward: autograd's thread has no user line)"
        self.findings.add(Finding(2, "cpu_fallback", f"{op} has no pjrt kernel: runs on the CPU{where}", file, line,
                                  data={"op": op}))

    def uninstall(self) -> None:
        from torch_pjrt._config import _log_fallback
        _C._set_fallback_logger(_log_fallback)
        _C._set_fallback_mode(self._mode)
