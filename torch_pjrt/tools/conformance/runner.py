"""Runs one OpInfo's samples on pjrt and on the CPU, phase by phase, and reports each outcome.

This is the in-process part of the harness: the worker process calls it, and so can
a test. It never lets an exception of a sample escape: every sample's outcome is a
SampleResult. Crashes and time limits are the supervisor's business (worker.py).

Per dtype the op claims on the CPU, the samples are chosen evenly from its reference
inputs (generated on the CPU, with a fixed seed), and each chosen sample runs:

- forward: the op on pjrt copies of the inputs vs the op on CPU copies;
- backward (float32, ops with autograd): gradients of sum_i <out_i, w_i>, w_i fixed
  random weights made on the CPU, w.r.t. every input that requires grad;
- noncontiguous: the same with every tensor input made non-contiguous (the values
  sit at every other element of a larger buffer, torch's noncontiguous_like);
- out: through the op's out= variant (ops with supports_out), into fresh tensors.

CPU fallbacks are read from torch_pjrt.metrics() around each pjrt call.
"""

from __future__ import annotations

import contextlib
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

import torch_pjrt

from . import opsel, settings
from .compare import WIDER, Mismatch, assert_matches, no_less_accurate_than_cpu, one_line, tied_indices_equivalent
from .records import ERROR, FAIL, PASS, PASS_BY_FLOAT64, PHASES, SKIP, OpInfoMeta, SampleResult

Emit = Callable[[str, dict[str, Any]], None]  # ("begin" | "result" | "meta", payload)


def _fallback_counts() -> dict[str, int]:
    return dict(torch_pjrt.metrics()["fallbacks"])


def _new_fallbacks(before: dict[str, int]) -> list[str]:
    after = _fallback_counts()
    return sorted(k for k, v in after.items() if v > before.get(k, 0))


def _error_message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(str(exc))}"


def _sync() -> None:
    """Surfaces deferred device errors (strict mode checks them at sync points)."""
    torch_pjrt.synchronize()


def evenly_spaced(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _map_sample(sample: Any, fn: Callable[[Any], Any],
                host_args: tuple[int, ...] = ()) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(input, args, kwargs) of a SampleInput with `fn` applied to every leaf (lists, tuples, dicts),
    except the positional args in `host_args`, which stay as the sample has them (on the CPU)."""

    def walk(x: Any) -> Any:
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, tuple) and not hasattr(x, "_fields") and not isinstance(x, torch.Size):
            return tuple(walk(v) for v in x)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return fn(x)

    with torch.no_grad():
        args = tuple(a if i in host_args else walk(a) for i, a in enumerate(sample.args))
        return walk(sample.input), args, walk(dict(sample.kwargs))


def _copier(device: torch.device, grad: bool) -> Callable[[Any], Any]:
    """Leaf mapper: tensors -> detached copies on `device` (requires_grad kept when `grad`);
    a CPU device named in the sample (factory functions, .to) -> `device`."""

    def copy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            y = x.detach().clone() if device.type == "cpu" else x.detach().to(device)
            if grad and x.requires_grad:
                y.requires_grad_(True)
            return y
        if device.type != "cpu":
            if isinstance(x, torch.device) and x.type == "cpu":
                return device
            if isinstance(x, str) and x == "cpu":
                return str(device)
        return x

    return copy


def _widener(grad: bool) -> Callable[[Any], Any]:
    """Leaf mapper: tensors -> CPU copies with float32 (complex64) widened to float64
    (complex128). Without `grad` the copy keeps the tensor's whole layout (its storage,
    strides and offset: ops such as as_strided read them); with it, a leaf that keeps
    requires_grad."""

    def copy(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        wide = WIDER.get(x.dtype, x.dtype)
        if grad:
            return x.detach().to(wide, copy=True).requires_grad_(x.requires_grad)
        x = x.detach()
        elements = x.untyped_storage().nbytes() // x.element_size()
        storage = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), 0, (elements,), (1,))
        return storage.to(wide).as_strided(x.size(), x.stride(), x.storage_offset())

    return copy


def _noncontiguous_like(x: Any) -> Any:
    """Leaf mapper: tensors -> torch's noncontiguous_like (same values, every other element)."""
    from torch.testing._internal.common_utils import noncontiguous_like

    return noncontiguous_like(x) if isinstance(x, torch.Tensor) else x


def _widens(sample: Any) -> bool:
    return any(t.dtype in WIDER for t in _tensors((sample.input, sample.args, sample.kwargs)))


def _noncontig_on(device: torch.device) -> Callable[[Any], Any]:
    """Leaf mapper for a CPU sample already made non-contiguous: the same layout on `device`
    (the larger buffer is copied, then the same view is taken), without requires_grad."""

    def copy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            base = x._base
            if (base is not None and tuple(base.shape) == tuple(x.shape) + (2,)
                    and tuple(x.stride()) == tuple(base.stride()[:-1])
                    and x.storage_offset() == base.storage_offset() + base.stride(-1)):
                # x is base[..., 1] (noncontiguous_like): the same layout on the device, even
                # where is_contiguous() cannot tell (size-1 dims), for ops that read storage.
                return base.detach().to(device)[..., 1]
            return x.detach().to(device)
        return _copier(device, grad=False)(x)

    return copy


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _detach(tree: Any) -> Any:
    return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, tree)


def _out_like(expected: Any, device: torch.device) -> Any:
    """Fresh out= tensors shaped like the CPU result (a tensor, or a tuple of tensors)."""
    if isinstance(expected, torch.Tensor):
        return torch.empty(expected.shape, dtype=expected.dtype, device=device)
    if isinstance(expected, (tuple, list)) and expected and all(isinstance(t, torch.Tensor) for t in expected):
        return tuple(torch.empty(t.shape, dtype=t.dtype, device=device) for t in expected)
    return None


class OpRunner:
    """Runs the samples of one OpInfo; reports through `emit` as it goes."""

    def __init__(
        self,
        op: Any,
        emit: Emit,
        *,
        device: torch.device | None = None,
        phases: Sequence[str] = PHASES,
        max_samples_float32: int = settings.MAX_SAMPLES_FLOAT32,
        max_samples_other: int = settings.MAX_SAMPLES_OTHER,
    ) -> None:
        self.op = op
        self.key = opsel.op_key(op)
        self.emit = emit
        self.device = device or torch_pjrt.device()
        self.phases = tuple(phases)
        self.max_f32 = max_samples_float32
        self.max_other = max_samples_other
        self.props_only = opsel.properties_only(op)
        self._host_args = settings.HOST_ARGS.get(op.name, ())
        self.values = not self.props_only

    # -- reporting -------------------------------------------------------------------------

    def _begin(self, dtype: str, phase: str, index: int) -> None:
        self.emit("begin", {"op": self.key, "dtype": dtype, "phase": phase, "index": index})

    def _result(self, dtype: str, phase: str, index: int, outcome: str, message: str = "",
                fallbacks: Sequence[str] = (), seconds: float = 0.0) -> None:
        r = SampleResult(self.key, dtype, phase, index, outcome, message, list(fallbacks), round(seconds, 4))
        self.emit("result", r.to_json())

    def _default_device(self, sample: Any) -> Any:
        """pjrt as the default device for samples that name no device and hold no tensor
        (e.g. ``arange(1, 3)``): on the CPU they make CPU tensors, on pjrt they should make
        pjrt tensors. Other samples run as they are."""
        mentions = False

        def look(x: Any) -> Any:
            nonlocal mentions
            if isinstance(x, (torch.Tensor, torch.device)) or (isinstance(x, str) and x == "cpu"):
                mentions = True
            return x

        _map_sample(sample, look)
        return contextlib.nullcontext() if mentions else self.device

    # -- the op ----------------------------------------------------------------------------

    def run(self, dtypes: Sequence[torch.dtype]) -> OpInfoMeta:
        op = self.op
        claimed = opsel.claimed_dtypes(op)
        meta = OpInfoMeta(
            op=self.key,
            properties_only=self.props_only,
            supports_autograd=bool(op.supports_autograd),
            supports_out=bool(op.supports_out),
            dtypes_claimed=[opsel.dtype_name(d) for d in claimed],
        )
        if self.key in settings.TORCH_SKIPS_CPU_COMPARISON:
            meta.notes.append(f"torch skips its own CPU comparison of this op: "
                              f"{settings.TORCH_SKIPS_CPU_COMPARISON[self.key]}")
        self.emit("meta", meta.to_json())  # now, in case the process dies on the way
        for dtype in dtypes:
            if dtype not in claimed:
                continue
            meta.dtypes_run.append(opsel.dtype_name(dtype))
            self._run_dtype(dtype, meta)
        self.emit("meta", meta.to_json())
        return meta

    def _run_dtype(self, dtype: torch.dtype, meta: OpInfoMeta) -> None:
        op = self.op
        name = opsel.dtype_name(dtype)
        grad = "backward" in self.phases and dtype == torch.float32 and dtype in opsel.backward_dtypes(op)
        torch.manual_seed(settings.SEED)
        pool: list[Any] = []
        try:
            for s in islice(op.reference_inputs("cpu", dtype, requires_grad=grad), settings.SAMPLE_POOL):
                pool.append(s)
        except Exception as exc:  # torch's own sample generator; not a pjrt result
            meta.notes.append(f"{name}: generating sample {len(pool)} raised {_error_message(exc)}")
        meta.samples_available[name] = len(pool)
        if not pool:
            meta.notes.append(f"{name}: no sample inputs on the CPU")
        cap = self.max_f32 if dtype == torch.float32 else self.max_other
        weights_gen = torch.Generator().manual_seed(settings.SEED)
        for index in evenly_spaced(len(pool), cap):
            self._run_sample(pool[index], index, name, grad, weights_gen)

    def _run_sample(self, sample: Any, index: int, dtype: str, grad: bool, weights_gen: torch.Generator) -> None:
        op = self.op
        try:
            _sync()
        except Exception:
            pass  # a deferred error of an earlier sample; it was reported there
        self._begin(dtype, "forward", index)
        cpu_in, cpu_args, cpu_kwargs = _map_sample(sample, _copier(torch.device("cpu"), grad))
        try:
            expected = op(cpu_in, *cpu_args, **cpu_kwargs)
        except Exception as exc:
            msg = f"CPU reference raised {_error_message(exc)}"
            if grad:  # e.g. an in-place op on a leaf that requires grad: run the rest without autograd
                self._result(dtype, "backward", index, SKIP, msg)
                grad = False
                cpu_in, cpu_args, cpu_kwargs = _map_sample(sample, _copier(torch.device("cpu"), grad))
                try:
                    expected = op(cpu_in, *cpu_args, **cpu_kwargs)
                    msg = ""
                except Exception as exc2:
                    msg = f"CPU reference raised {_error_message(exc2)}"
            if msg:
                for phase in self.phases:
                    if phase != "backward" and (phase != "out" or op.supports_out):
                        self._result(dtype, phase, index, SKIP, msg)
                return
        process = sample.output_process_fn_grad

        actual = None
        if "forward" in self.phases or grad:
            dev_in, dev_args, dev_kwargs = _map_sample(sample, _copier(self.device, grad), self._host_args)
            actual, outcome, msg, fallbacks, seconds = self._compare_on_device(
                sample, (cpu_in, cpu_args, cpu_kwargs), (dev_in, dev_args, dev_kwargs), expected)
            if "forward" in self.phases:
                self._result(dtype, "forward", index, outcome, msg, fallbacks, seconds)
            if grad:
                self._begin(dtype, "backward", index)
                if actual is None or outcome == ERROR:
                    self._result(dtype, "backward", index, ERROR, "forward raised on pjrt: " + msg)
                else:
                    self._backward(sample, dtype, index, process(expected), process(actual),
                                   (cpu_in, cpu_args, cpu_kwargs), (dev_in, dev_args, dev_kwargs), weights_gen)

        if "noncontiguous" in self.phases:
            self._begin(dtype, "noncontiguous", index)
            self._noncontiguous(sample, dtype, index)
        if "out" in self.phases and op.supports_out:
            self._begin(dtype, "out", index)
            self._out(sample, dtype, index, _detach(expected))

    def _compare_on_device(self, sample: Any, cpu_sample: tuple, dev_sample: tuple, expected: Any,
                           noncontiguous: bool = False) -> tuple[Any, str, str, list[str], float]:
        """Runs the op on the device inputs and compares with the CPU result:
        (actual or None, outcome, message, ops that fell back, seconds)."""
        op = self.op
        process = sample.output_process_fn_grad
        dev_in, dev_args, dev_kwargs = dev_sample
        before = _fallback_counts()
        t0 = time.perf_counter()
        fallbacks: list[str] = []
        actual = None
        try:
            with self._default_device(sample):
                actual = op(dev_in, *dev_args, **dev_kwargs)
            fallbacks = _new_fallbacks(before)
            assert_matches(process(actual), process(expected), self.device.type, values=self.values)
            _sync()
            outcome, msg = PASS, ""
        except Mismatch as exc:
            outcome, msg = FAIL, str(exc)
            if tied_indices_equivalent(op.name, *cpu_sample, actual, expected):
                outcome, msg = PASS, ""
            elif self._as_accurate(sample, process(actual), process(expected), noncontiguous):
                outcome, msg = PASS, f"{PASS_BY_FLOAT64}: {msg}"
        except Exception as exc:
            fallbacks = fallbacks or _new_fallbacks(before)
            outcome, msg = ERROR, _error_message(exc)
        return actual, outcome, msg, fallbacks, time.perf_counter() - t0

    def _as_accurate(self, sample: Any, actual: Any, expected: Any, noncontiguous: bool = False) -> bool:
        """Whether a float32 result that missed the CPU's float32 one is at least as close to
        the op's result on float64 copies of the sample's inputs (made non-contiguous as in
        that phase when `noncontiguous`); all three through the sample's output processing."""
        if not self.values or not _widens(sample) or self.op.name in settings.NOT_JUDGED_BY_FLOAT64:
            return False
        try:
            with torch.no_grad():
                inp, args, kwargs = _map_sample(sample, _widener(grad=False))
                if noncontiguous:
                    inp, args, kwargs = _map_sample(_Sample(inp, args, kwargs), _noncontiguous_like)
                reference = sample.output_process_fn_grad(self.op(inp, *args, **kwargs))
            return no_less_accurate_than_cpu(actual, expected, reference, self.device.type)
        except Exception:
            return False  # no float64 run to judge by: the mismatch stands

    def _as_accurate_grads(self, sample: Any, chosen: list[int], weights: list[torch.Tensor],
                           got: list[Any], want: list[Any]) -> bool:
        """_as_accurate for the gradients of the backward phase."""
        if not _widens(sample) or self.op.name in settings.NOT_JUDGED_BY_FLOAT64:
            return False
        try:
            inp, args, kwargs = _map_sample(sample, _widener(grad=True))
            leaves = tree_flatten(sample.output_process_fn_grad(self.op(inp, *args, **kwargs)))[0]
            outs = [leaves[i] for i in chosen]
            loss = sum((o * w.to(o.dtype)).sum() for o, w in zip(outs, weights))
            inputs = [t for t in _tensors((inp, args, kwargs)) if t.requires_grad]
            reference = list(torch.autograd.grad(loss, inputs, allow_unused=True))
            return no_less_accurate_than_cpu(got, want, reference, self.device.type)
        except Exception:
            return False

    def _backward(self, sample: Any, dtype: str, index: int, expected: Any, actual: Any, cpu_sample: tuple, dev_sample: tuple,
                  weights_gen: torch.Generator) -> None:
        e_leaves = tree_flatten(expected)[0]
        a_leaves = tree_flatten(actual)[0]
        cpu_outs, dev_outs, chosen = [], [], []
        for i, e in enumerate(e_leaves):
            if isinstance(e, torch.Tensor) and e.requires_grad and (e.is_floating_point() or e.is_complex()):
                a = a_leaves[i] if i < len(a_leaves) else None
                if not isinstance(a, torch.Tensor) or not a.requires_grad:
                    self._result(dtype, "backward", index, FAIL, f"output {i} requires grad on the CPU but not on pjrt")
                    return
                cpu_outs.append(e)
                dev_outs.append(a)
                chosen.append(i)
        cpu_inputs = [t for t in _tensors(cpu_sample) if t.requires_grad]
        dev_inputs = [t for t in _tensors(dev_sample) if t.requires_grad]
        if not cpu_outs or not cpu_inputs:
            self._result(dtype, "backward", index, SKIP, "no differentiable output or input")
            return
        weights = [torch.randn(o.shape, dtype=o.dtype, generator=weights_gen) for o in cpu_outs]
        try:
            loss = sum((o * w).sum() for o, w in zip(cpu_outs, weights))
            want = torch.autograd.grad(loss, cpu_inputs, allow_unused=True)
        except Exception as exc:
            self._result(dtype, "backward", index, SKIP, f"CPU backward raised {_error_message(exc)}")
            return
        dev_weights = [w.to(self.device) for w in weights]
        before = _fallback_counts()
        t0 = time.perf_counter()
        fallbacks: list[str] = []
        try:
            dev_loss = sum((o * w).sum() for o, w in zip(dev_outs, dev_weights))
            got = torch.autograd.grad(dev_loss, dev_inputs, allow_unused=True)
            fallbacks = _new_fallbacks(before)
            assert_matches(list(got), list(want), self.device.type, values=self.values, what="grad")
            _sync()
            outcome, msg = PASS, ""
        except Mismatch as exc:
            outcome, msg = FAIL, str(exc)
            if self.values and self._as_accurate_grads(sample, chosen, weights, list(got), list(want)):
                outcome, msg = PASS, f"{PASS_BY_FLOAT64}: {msg}"
        except Exception as exc:
            fallbacks = fallbacks or _new_fallbacks(before)
            outcome, msg = ERROR, _error_message(exc)
        self._result(dtype, "backward", index, outcome, msg, fallbacks, time.perf_counter() - t0)

    def _noncontiguous(self, sample: Any, dtype: str, index: int) -> None:
        op = self.op
        try:
            cpu_in, cpu_args, cpu_kwargs = _map_sample(sample, _copier(torch.device("cpu"), grad=False))
            with torch.no_grad():
                cpu_in, cpu_args, cpu_kwargs = _map_sample(_Sample(cpu_in, cpu_args, cpu_kwargs), _noncontiguous_like)
            expected = op(cpu_in, *cpu_args, **cpu_kwargs)
        except Exception as exc:
            self._result(dtype, "noncontiguous", index, SKIP, f"CPU reference raised {_error_message(exc)}")
            return
        dev_in, dev_args, dev_kwargs = _map_sample(_Sample(cpu_in, cpu_args, cpu_kwargs), _noncontig_on(self.device),
                                                   self._host_args)
        _, outcome, msg, fallbacks, seconds = self._compare_on_device(
            sample, (cpu_in, cpu_args, cpu_kwargs), (dev_in, dev_args, dev_kwargs), expected, noncontiguous=True)
        self._result(dtype, "noncontiguous", index, outcome, msg, fallbacks, seconds)

    def _out(self, sample: Any, dtype: str, index: int, expected: Any) -> None:
        op = self.op
        cpu_out = _out_like(expected, torch.device("cpu"))
        if cpu_out is None:
            self._result(dtype, "out", index, SKIP, "result is not a tensor or a tuple of tensors")
            return
        try:
            cpu_in, cpu_args, cpu_kwargs = _map_sample(sample, _copier(torch.device("cpu"), grad=False))
            op(cpu_in, *cpu_args, out=cpu_out, **cpu_kwargs)
        except Exception as exc:
            self._result(dtype, "out", index, SKIP, f"CPU out= raised {_error_message(exc)}")
            return
        try:
            # The CPU's out= against its own functional result: where they differ, torch's out=
            # path is wrong (fft.ihfftn over one dim leaves `out` unwritten) and no reference.
            assert_matches(cpu_out, expected, "cpu", values=self.values, what="out")
        except Mismatch as exc:
            self._result(dtype, "out", index, SKIP, f"CPU out= disagrees with its own result: {exc}")
            return
        dev_in, dev_args, dev_kwargs = _map_sample(sample, _copier(self.device, grad=False), self._host_args)
        dev_out = _out_like(expected, self.device)
        # Through the sample's output processing, as forward: it makes results torch defines
        # only up to a choice (eigenvector and singular-vector signs) comparable.
        process = sample.output_process_fn_grad
        before = _fallback_counts()
        t0 = time.perf_counter()
        fallbacks: list[str] = []
        try:
            op(dev_in, *dev_args, out=dev_out, **dev_kwargs)
            fallbacks = _new_fallbacks(before)
            assert_matches(process(dev_out), process(cpu_out), self.device.type, values=self.values, what="out")
            _sync()
            outcome, msg = PASS, ""
        except Mismatch as exc:
            outcome, msg = FAIL, str(exc)
            if tied_indices_equivalent(op.name, cpu_in, cpu_args, cpu_kwargs, dev_out, cpu_out):
                outcome, msg = PASS, ""
            elif self._as_accurate(sample, process(dev_out), process(cpu_out)):
                outcome, msg = PASS, f"{PASS_BY_FLOAT64}: {msg}"
        except Exception as exc:
            fallbacks = fallbacks or _new_fallbacks(before)
            outcome, msg = ERROR, _error_message(exc)
        self._result(dtype, "out", index, outcome, msg, fallbacks, time.perf_counter() - t0)


class _Sample:
    """The (input, args, kwargs) triple in SampleInput's shape, for _map_sample."""

    def __init__(self, input: Any, args: tuple, kwargs: dict) -> None:
        self.input, self.args, self.kwargs = input, args, kwargs


def run_op(op: Any, dtypes: Sequence[torch.dtype], emit: Emit, **options: Any) -> OpInfoMeta:
    """Runs one OpInfo with CPU-fallback warnings (and torch's other warnings) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return OpRunner(op, emit, **options).run(dtypes)
        except Exception as exc:  # a harness bug: still data, never a silent loss
            meta = OpInfoMeta(op=opsel.op_key(op))
            meta.notes.append("harness error: " + one_line(traceback.format_exc(), 1000))
            emit("meta", meta.to_json())
            del exc
            return meta
