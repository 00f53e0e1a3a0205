"""Run a CUDA script on pjrt: device strings, `.cuda()`, `torch.cuda.*`,
autocast, `torch.compile`'s backend and NCCL are redirected, each redirection
recorded at the user's line. Values are untouched: only where they live."""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from .dynamo_watch import watch_dynamo
from .findings import _PACKAGE_DIR, _TORCH_DIR, Finding, Findings, user_site


def is_cuda(device: Any, names: tuple[str, ...] = ("cuda",)) -> bool:
    if isinstance(device, str):
        return any(device == n or device.startswith(n + ":") for n in names)
    return isinstance(device, torch.device) and device.type in names


RANDOM_FACTORIES = {torch.randn, torch.rand, torch.randint, torch.randperm, torch.normal, torch.bernoulli,
                    torch.randn_like, torch.rand_like, torch.randint_like}


def _drawn_on_cpu(func: Any, target: Any) -> Callable[..., torch.Tensor]:
    @functools.wraps(func)
    def draw(*args: Any, **kwargs: Any) -> torch.Tensor:
        requires_grad = kwargs.pop("requires_grad", False)
        return func(*args, **kwargs).to(target).requires_grad_(requires_grad)  # a leaf, as asked
    return draw


class Redirect:
    """Maps "cuda" to `target` ("pjrt", or "cpu" for the parity run) and
    records every redirection."""

    def __init__(self, findings: Findings, target: str) -> None:
        self.findings = findings
        self.target = target
        # The parity run maps pjrt to the CPU too (a script already ported names it).
        self.names = ("cuda",) if target != "cpu" else ("cuda", torch._C._get_privateuse1_backend_name())
        self.used_autocast = False  # lower-precision compute: parity is judged more loosely
        self.unscaled: dict[int, torch.Tensor] = {}  # GradScaler.scale's output -> the loss it scaled
        self.first_input: tuple[str, tuple[int, ...]] | None = None  # of a compiled module's first call
        self._undo: list[Callable[[], None]] = []

    # ---- values -------------------------------------------------------------
    def device(self, device: Any) -> Any:
        if isinstance(device, str) and is_cuda(device, self.names):
            index = device.partition(":")[2]
            return self.target if self.target == "cpu" or not index else f"{self.target}:{index}"
        if isinstance(device, torch.device) and device.type in self.names:
            return torch.device(self.target, device.index) if self.target != "cpu" else torch.device("cpu")
        return device

    def note(self, what: str, site: tuple[str | None, int | None] | None = None) -> None:
        if torch.compiler.is_compiling():
            return  # a frame walk inside Dynamo's trace would break the graph
        file, line = site or user_site(3)
        self.findings.add(Finding(1, "cuda_call", f"{what} (redirected to {self.target})", file, line))

    def torch_function(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple, dict]:
        """Rewrites one call seen by the doctor's TorchFunctionMode."""
        if func is torch.Tensor.cuda:
            index = args[1] if len(args) > 1 else kwargs.get("device")
            self.note("Tensor.cuda()")
            kwargs = {k: v for k, v in kwargs.items() if k in ("non_blocking", "memory_format")}
            target = self.device(torch.device("cuda", index if isinstance(index, int) else 0))
            return torch.Tensor.to, (args[0], target), kwargs
        if func is torch.device and args and is_cuda(args[0], self.names):
            self.note(f"torch.device({args[0]!r})")
            return func, (self.device(args[0] if len(args) == 1 else torch.device(*args)),), kwargs
        if func is torch.Tensor.to and len(args) > 1 and is_cuda(args[1], self.names):
            self.note(f".to({str(args[1])!r})")
            args = (args[0], self.device(args[1]), *args[2:])
        device = kwargs.get("device")
        if is_cuda(device, self.names):
            self.note(f"device={str(device)!r} in {getattr(func, '__name__', func)}")
            target = self.device(device)
            if func in RANDOM_FACTORIES:
                # Drawn from the CPU generator, then moved: the pjrt run and the
                # CPU parity run see the same numbers.
                return _drawn_on_cpu(func, target), args, dict(kwargs, device="cpu")
            kwargs = dict(kwargs, device=target)
        return func, args, kwargs

    # ---- patches ------------------------------------------------------------
    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> None:
        self._patch_cuda_module()
        self._patch_autocast()
        self._patch_compile()
        self._patch_process_group()
        original_default = torch.set_default_device

        def set_default_device(device: Any) -> None:
            if is_cuda(device, self.names):
                self.note(f"torch.set_default_device({str(device)!r})")
            original_default(self.device(device))

        self._patch(torch, "set_default_device", set_default_device)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch_cuda_module(self) -> None:
        device_module = getattr(torch, self.target, None) if self.target != "cpu" else None

        def from_user() -> bool:
            path = sys._getframe(2).f_code.co_filename
            return not path.startswith((_TORCH_DIR, _PACKAGE_DIR))

        def redirect(name: str, fallback: Callable[..., Any]) -> None:
            original = getattr(torch.cuda, name, None)
            if original is None:
                return

            @functools.wraps(original)
            def call(*args: Any, **kwargs: Any) -> Any:
                if not from_user():  # torch asking about CUDA itself: the truth
                    return original(*args, **kwargs)
                self.note(f"torch.cuda.{name}()")
                impl = getattr(device_module, name, None) if device_module is not None else None
                return (impl or fallback)(*args, **kwargs)

            self._patch(torch.cuda, name, call)

        nothing = lambda *a, **k: None  # noqa: E731
        redirect("is_available", lambda: True)
        redirect("is_bf16_supported", lambda *a, **k: True)
        redirect("get_device_properties", lambda *a, **k: types.SimpleNamespace(
            name=f"{self.target} (redirected from cuda)", total_memory=0, major=0, minor=0,
            multi_processor_count=0))
        redirect("mem_get_info", lambda *a, **k: (0, 0))
        redirect("device_count", lambda: 1)
        redirect("current_device", lambda: 0)
        redirect("set_device", nothing)
        redirect("synchronize", nothing)
        redirect("empty_cache", nothing)
        # CUDA seeds seed pjrt's generator; on the CPU run nothing (the CPU generator
        # draws the redirected random factories in both runs alike).
        redirect("manual_seed", nothing)
        redirect("manual_seed_all", nothing)
        redirect("get_device_name", lambda *a: f"{self.target} (redirected from cuda)")
        # Functions only: classes (Stream, Event) stay, since libraries use them in
        # annotations such as `torch.cuda.Stream | None`.
        for name in ("memory_allocated", "max_memory_allocated"):
            redirect(name, lambda *a, **k: 0)  # the CPU run: no device memory
        for name in ("reset_peak_memory_stats", "current_stream", "get_rng_state", "set_rng_state"):
            redirect(name, nothing)
        redirect("stream", lambda *a, **k: contextlib.nullcontext())
        redirect("memory_stats", lambda *a, **k: {})

    def _patch_autocast(self) -> None:
        original = torch.autocast
        redirect = self

        # A function returning torch's own autocast: Dynamo recognizes that class
        # (a subclass would graph-break compiled code that enters autocast).
        @functools.wraps(original)
        def autocast(device_type: str = "cuda", *args: Any, **kwargs: Any) -> Any:
            if redirect.target == "cpu":  # the parity reference is plain float32
                return original("cpu", enabled=False)
            if is_cuda(device_type, redirect.names):
                redirect.note(f"torch.autocast({device_type!r})")
                device_type = redirect.target
            if kwargs.get("enabled", True) is not False:
                redirect.used_autocast = True  # under Dynamo too: a plain attribute store it replays
            return original(device_type, *args, **kwargs)

        self._patch(torch, "autocast", autocast)
        self._patch(torch.amp, "autocast", autocast)
        if hasattr(torch.cuda, "amp"):
            def cuda_autocast(enabled: bool = True, dtype: torch.dtype = torch.float16,
                              cache_enabled: bool = True) -> Any:  # the old API's argument order
                return autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
            self._patch(torch.cuda.amp, "autocast", cuda_autocast)
        original_scaler = torch.amp.GradScaler

        class GradScaler(original_scaler):  # type: ignore[misc,valid-type]
            def __init__(self, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
                if is_cuda(device, redirect.names):
                    redirect.note(f"GradScaler({device!r})")
                    device = redirect.target
                super().__init__(device, *args, **kwargs)

            def scale(self, outputs: Any) -> Any:
                scaled = super().scale(outputs)
                if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor):
                    redirect.unscaled[id(scaled)] = outputs  # parity compares the loss, not loss x scale
                return scaled

        self._patch(torch.amp, "GradScaler", GradScaler)
        if hasattr(torch.cuda, "amp"):
            self._patch(torch.cuda.amp, "GradScaler", lambda *a, **k: GradScaler("cuda", *a, **k))

    def _patch_compile(self) -> None:
        original = torch.compile
        redirect = self
        backend = "pjrt" if self.target != "cpu" else "inductor"

        @functools.wraps(original)
        def compile(model: Any = None, **kwargs: Any) -> Any:  # noqa: A001
            if redirect.target == "cpu":  # the parity reference runs eagerly
                return model if model is not None else (lambda fn: fn)
            watch_dynamo(redirect.findings)
            asked = kwargs.get("backend")
            if asked is None or asked == "inductor":
                dropped = {k: kwargs.pop(k) for k in ("mode", "options") if kwargs.get(k) not in (None, "default")}
                kwargs["backend"] = backend
                file, line = user_site(2)
                if redirect.target != "cpu":
                    note = f"torch.compile(backend={asked!r}) runs with backend='{backend}'"
                    if dropped:
                        note += f"; ignored {dropped}"
                    redirect.findings.add(Finding(1, "compile_backend", note, file, line, severity="info"))
            compiled = original(model, **kwargs) if model is not None else original(**kwargs)
            if isinstance(compiled, torch.nn.Module):
                redirect._watch_first_input(compiled)
            return compiled

        self._patch(torch, "compile", compile)

    def _watch_first_input(self, module: torch.nn.Module) -> None:
        """The first call's token ids (or batch), for throughput: a hook on the
        compiled wrapper runs outside Dynamo's frame, then removes itself."""
        def hook(_: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            handle.remove()
            for value in (*args, *kwargs.values()):
                if isinstance(value, torch.Tensor) and value.dim() >= 2 and self.first_input is None:
                    kind = "samples" if value.dtype.is_floating_point else "tokens"
                    self.first_input = (kind, tuple(value.shape))
        handle = module.register_forward_pre_hook(hook, with_kwargs=True)

    def _patch_process_group(self) -> None:
        import torch.distributed as dist
        if not dist.is_available():
            return
        original = dist.init_process_group

        @functools.wraps(original)
        def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
            name = kwargs.pop("backend", backend)
            if isinstance(name, str) and "nccl" in name:
                file, line = user_site(2)
                replacement = "pjrt" if self.target != "cpu" else "gloo"
                self.findings.add(Finding(1, "nccl", f"init_process_group({name!r}) uses {replacement!r} instead",
                                          file, line))
                name = name.replace("nccl", replacement)
                if self.target != "cpu":  # "cpu:gloo,cuda:nccl": the device key too
                    name = name.replace("cuda:", f"{self.target}:")
            return original(name, *args, **kwargs)

        self._patch(dist, "init_process_group", init_process_group)
