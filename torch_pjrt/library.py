"""User kernels written in JAX (Pallas included) or given as StableHLO, as PyTorch operators.

``jax_op("mylib::rms_norm")`` on a JAX function registers a real ``torch.library`` operator:

- on pjrt tensors, the function's StableHLO (exported by JAX for the inputs' shapes and
  dtypes) becomes one op of the device graph: it runs inside fused graphs and compiled
  programs (no graph break, no call out), and alone in strict mode;
- on CPU tensors, JAX runs it on the host (the reference to check the device against);
- a fake implementation from ``jax.eval_shape``, so Dynamo traces through it;
- autograd from JAX's own VJP, itself a second operator (``<op>_vjp``) run the same way.

Each distinct input signature (shapes, dtypes, static arguments) is exported once per
process and named by a hash of its StableHLO, so the device's program caches (memory and
disk) key on the kernel's code. ``stablehlo_op`` takes StableHLO text directly.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import _C

_STATIC_TYPES = {float: "float", int: "int", bool: "bool", str: "str"}


@dataclass(frozen=True)
class _Exported:
    symbol: str  # the entry function's name in the device graph
    outputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]


def _jax() -> Any:
    try:
        import jax
    except ImportError as e:  # pragma: no cover - the test requirements pin JAX
        raise ImportError("torch_pjrt.library: JAX kernels need JAX (pip install jax)") from e
    return jax


# The dtypes a JAX kernel exchanges with torch, by their NumPy (and JAX) name.
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int32": torch.int32, "int64": torch.int64, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "bool": torch.bool, "complex64": torch.complex64, "complex128": torch.complex128}
_DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in _DTYPES.items()}


def _jax_dtype(dtype: torch.dtype) -> Any:
    import jax.numpy as jnp

    if dtype not in _DTYPE_NAMES:
        raise TypeError(f"no JAX dtype for {dtype}")
    return jnp.dtype(_DTYPE_NAMES[dtype])


def _torch_dtype(dtype: Any) -> torch.dtype:
    import numpy as np

    name = np.dtype(dtype).name
    if name not in _DTYPES:
        raise TypeError(f"no torch dtype for JAX's {name}")
    return _DTYPES[name]


def _x64(dtypes: Sequence[torch.dtype]) -> Any:
    """JAX's 64-bit mode when an input is 64-bit (so float64 and int64 keep their types),
    JAX's default otherwise (so a constant like jnp.zeros(3) stays float32, as in plain JAX)."""
    wide = any(d in (torch.float64, torch.int64, torch.complex128) for d in dtypes)
    return _jax().enable_x64(wide)


def _lowering_platform() -> str:
    """The JAX platform to lower for: the running plugin's, so platform-specific lowerings
    (linear algebra's library calls) are the device's, never the host's by default."""
    name = str(_C._platform()[0]).lower()
    for jax_name, words in (("cuda", ("cuda", "gpu", "nvidia")), ("rocm", ("rocm", "amd")), ("tpu", ("tpu",))):
        if any(w in name for w in words):
            return jax_name
    return "cpu"


def _private_functions(module: Any, prefix: str) -> tuple[str, str]:
    """The module's functions renamed under `prefix` and made private, printed in MLIR's
    generic form (what any StableHLO consumer parses, whatever its version's pretty
    syntax), without locations. Returns (entry symbol, text)."""
    from jax._src.lib.mlir import ir

    with module.context:
        ops = list(module.body.operations)
        for op in ops:
            old = ir.StringAttr(op.attributes["sym_name"]).value
            ir.SymbolTable.replace_all_symbol_uses(old, f"{prefix}_{old}", module.operation)
            ir.SymbolTable.set_symbol_name(op, f"{prefix}_{old}")
            op.attributes["sym_visibility"] = ir.StringAttr.get("private")
        text = "\n".join(op.get_asm(print_generic_op_form=True, enable_debug_info=False) for op in ops)
    return f"{prefix}_main", text


class _Kernel:
    """One JAX function as an operator: its exports per signature and its host run."""

    def __init__(self, qualname: str, fn: Callable[..., Any], tensor_args: list[str], static_args: list[str]) -> None:
        self.qualname = qualname
        self.fn = fn
        self.tensor_args = tensor_args
        self.static_args = static_args
        self._exports: dict[Any, _Exported] = {}
        self._host: dict[Any, Any] = {}  # statics -> the jitted function JAX runs on the host
        self._lock = threading.Lock()

    def _bound(self, statics: Sequence[Any]) -> Callable[..., Any]:
        return functools.partial(self.fn, **dict(zip(self.static_args, statics)))

    def _specs(self, tensors: Sequence[torch.Tensor]) -> list[Any]:
        jax = _jax()
        specs = []
        for name, t in zip(self.tensor_args, tensors):
            try:
                specs.append(jax.ShapeDtypeStruct(tuple(t.shape), _jax_dtype(t.dtype)))
            except TypeError as e:
                raise TypeError(f"{self.qualname}: argument {name!r}: {e}") from None
        return specs

    def _outputs(self, result: Any) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
        leaves = result if isinstance(result, (tuple, list)) else (result,)
        return tuple((tuple(int(d) for d in leaf.shape), _torch_dtype(leaf.dtype)) for leaf in leaves)

    def export(self, tensors: Sequence[torch.Tensor], statics: Sequence[Any]) -> _Exported:
        # Statics by type and repr: 0.0 and -0.0 are two exports, and NaN finds its own.
        key = (tuple((tuple(t.shape), t.dtype) for t in tensors), tuple((type(v), repr(v)) for v in statics))
        with self._lock:
            found = self._exports.get(key)
            if found is not None:
                return found
            jax = _jax()
            specs = self._specs(tensors)
            try:
                with _x64([t.dtype for t in tensors]):
                    # keep_unused: the call passes every input, used or not (a linear
                    # function's VJP does not read its primals).
                    traced = jax.jit(self._bound(statics), keep_unused=True).trace(*specs)
                    lowered = traced.lower(lowering_platforms=(_lowering_platform(),))
                    outputs = self._outputs(lowered.out_info)
                    module = lowered.compiler_ir("stablehlo")
            except Exception as e:
                shapes = ", ".join(f"{n}: {tuple(t.shape)} {t.dtype}" for n, t in zip(self.tensor_args, tensors))
                raise RuntimeError(f"{self.qualname}: JAX could not export the function for ({shapes}): "
                                   f"{type(e).__name__}: {e}") from e
            digest = hashlib.sha256(module.operation.get_asm(print_generic_op_form=True,
                                                             enable_debug_info=False).encode()).hexdigest()[:16]
            prefix = "k_" + self.qualname.replace("::", "_").replace(".", "_") + "_" + digest
            symbol, text = _private_functions(module, prefix)
            _C._define_kernel(symbol, text)
            found = _Exported(symbol, outputs)
            self._exports[key] = found
            return found

    def like(self, tensors: Sequence[torch.Tensor], statics: Sequence[Any], device: torch.device) -> list[torch.Tensor]:
        """Empty results of the right shapes and dtypes on `device` (fake ones under fake mode)."""
        jax = _jax()
        with _x64([t.dtype for t in tensors]):
            try:
                result = jax.eval_shape(self._bound(statics), *self._specs(tensors))
            except Exception as e:
                raise RuntimeError(f"{self.qualname}: JAX could not trace the function: {type(e).__name__}: {e}") from e
        return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self._outputs(result)]

    def run_pjrt(self, tensors: Sequence[torch.Tensor], statics: Sequence[Any]) -> list[torch.Tensor]:
        exported = self.export(tensors, statics)
        like = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in exported.outputs]
        return list(_C._call_kernel(self.qualname, exported.symbol, list(tensors), like))

    def run_host(self, tensors: Sequence[torch.Tensor], statics: Sequence[Any]) -> list[torch.Tensor]:
        jax = _jax()
        key = tuple((type(v), repr(v)) for v in statics)
        with self._lock:
            jitted = self._host.get(key)
            if jitted is None:
                jitted = self._host[key] = jax.jit(self._bound(statics))
        with _x64([t.dtype for t in tensors]):
            arrays = [jax.dlpack.from_dlpack(t.detach().contiguous()) for t in tensors]
            try:
                result = jitted(*arrays)
            except Exception as e:
                raise RuntimeError(f"{self.qualname}: JAX failed on the host: {type(e).__name__}: {e}") from e
        leaves = result if isinstance(result, (tuple, list)) else (result,)
        return [torch.from_dlpack(leaf).clone() for leaf in leaves]


def _signature(fn: Callable[..., Any], qualname: str) -> tuple[list[str], list[str], list[str]]:
    """(tensor names, static names, schema arguments): parameters without a default are
    tensors; those with a default of float, int, bool or str are static (part of the key)."""
    tensors, statics, schema = [], [], []
    for p in inspect.signature(fn).parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(f"{qualname}: *args and **kwargs cannot be an operator's arguments")
        if p.default is p.empty:
            if statics:
                raise TypeError(f"{qualname}: tensor argument {p.name!r} follows a static one")
            tensors.append(p.name)
            schema.append(f"Tensor {p.name}")
        else:
            kind = _STATIC_TYPES.get(type(p.default))
            if kind is None:
                raise TypeError(f"{qualname}: static argument {p.name!r} needs a float, int, bool or str default")
            if kind == "float" and not math.isfinite(p.default):
                raise TypeError(f"{qualname}: static argument {p.name!r}: a schema default must be finite")
            if kind == "str" and any(c in p.default for c in "\"'\\"):
                raise TypeError(f"{qualname}: static argument {p.name!r}: a schema default cannot hold quotes or backslashes")
            statics.append(p.name)
            default = f'"{p.default}"' if kind == "str" else repr(p.default)
            schema.append(f"{kind} {p.name}={default}")
    return tensors, statics, schema


_LIBRARIES: dict[str, torch.library.Library] = {}


def _library(namespace: str) -> torch.library.Library:
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    return _LIBRARIES[namespace]


def _split(qualname: str) -> tuple[str, str]:
    namespace, _, name = qualname.partition("::")
    if not namespace or not name:
        raise ValueError(f"torch_pjrt.library: an operator's name is 'namespace::name', got {qualname!r}")
    return namespace, name


def _returns(outputs: int) -> str:
    """A schema's return type for `outputs` tensors."""
    return "Tensor" if outputs == 1 else "(" + ", ".join(["Tensor"] * outputs) + ")"


def _register(qualname: str, kernel: _Kernel, schema_args: list[str], outputs: int) -> Any:
    namespace, name = _split(qualname)
    returns = _returns(outputs)
    lib = _library(namespace)
    lib.define(f"{name}({', '.join(schema_args)}) -> {returns}")
    n = len(kernel.tensor_args)

    def split(args: tuple[Any, ...]) -> tuple[list[torch.Tensor], list[Any]]:
        tensors, statics = list(args[:n]), list(args[n:])
        for arg, t in zip(kernel.tensor_args, tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{qualname}: argument {arg!r} must be a tensor, got {type(t).__name__}")
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise RuntimeError(f"{qualname}: expected all tensors on one device, got {sorted(map(str, devices))}")
        return tensors, statics

    def result(outs: list[torch.Tensor]) -> Any:
        if len(outs) != outputs:
            raise RuntimeError(f"{qualname}: the function returned {len(outs)} results, the operator declares {outputs}")
        return outs[0] if outputs == 1 else tuple(outs)

    def on_pjrt(*args: Any) -> Any:
        return result(kernel.run_pjrt(*split(args)))

    def on_host(*args: Any) -> Any:
        return result(kernel.run_host(*split(args)))

    def fake(*args: Any) -> Any:
        tensors, statics = split(args)
        return result(kernel.like(tensors, statics, tensors[0].device if tensors else torch.device("cpu")))

    lib.impl(name, on_pjrt, "PrivateUse1")
    lib.impl(name, on_host, "CPU")
    torch.library.register_fake(qualname, fake, lib=lib)
    return getattr(getattr(torch.ops, namespace), name)


def jax_op(qualname: str, fn: Callable[..., Any] | None = None, *, outputs: int = 1,
           differentiable: bool = True) -> Any:
    """Registers JAX function `fn` as the operator `qualname` ("namespace::name"); usable
    as a decorator. Parameters without a default are tensors; parameters with a float,
    int, bool or str default are static (each value is its own export). `outputs`: how
    many tensors it returns. With `differentiable`, the gradient comes from JAX's VJP.
    Returns the operator (``torch.ops.namespace.name``)."""
    if fn is None:
        return lambda f: jax_op(qualname, f, outputs=outputs, differentiable=differentiable)
    tensors, statics, schema = _signature(fn, qualname)
    kernel = _Kernel(qualname, fn, tensors, statics)
    op = _register(qualname, kernel, schema, outputs)
    if differentiable:
        _register_vjp(qualname, kernel, schema, outputs)
    return op


def _register_vjp(qualname: str, kernel: _Kernel, schema: list[str], outputs: int) -> None:
    """The backward as an operator of its own: (primals..., cotangents..., statics) ->
    one gradient per tensor argument (zeros for integer ones, which have none)."""
    n = len(kernel.tensor_args)

    def vjp_fn(*args: Any, **static: Any) -> Any:
        jax = _jax()
        import jax.numpy as jnp

        primals, cotangents = args[:n], args[n:]
        floating = [i for i, p in enumerate(primals) if jnp.issubdtype(p.dtype, jnp.floating)]

        def of_floating(*xs: Any) -> Any:
            full = list(primals)
            for i, x in zip(floating, xs):
                full[i] = x
            out = kernel.fn(*full, **static)
            return tuple(out) if isinstance(out, (tuple, list)) else out

        _, pull = jax.vjp(of_floating, *(primals[i] for i in floating))
        grads = pull(tuple(cotangents) if outputs > 1 else cotangents[0])
        out = [jnp.zeros(p.shape, p.dtype) for p in primals]
        for i, g in zip(floating, grads):
            out[i] = g
        return tuple(out)

    names = kernel.tensor_args + [f"grad_{i}" for i in range(outputs)]
    signature = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names]
    signature += [inspect.Parameter(s, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=inspect.signature(kernel.fn).parameters[s].default)
                  for s in kernel.static_args]
    vjp_fn.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
    backward_kernel = _Kernel(qualname + "_vjp", vjp_fn, names, kernel.static_args)
    backward_schema = [f"Tensor {name}" for name in names] + schema[n:]
    backward_op = _register(qualname + "_vjp", backward_kernel, backward_schema, n)

    def no_double_backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(f"{qualname}: a second derivative (backward of {qualname}_vjp) is not supported")

    torch.library.register_autograd(qualname + "_vjp", no_double_backward)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(*inputs[:n])
        ctx.statics = inputs[n:]
        results = output if isinstance(output, tuple) else (output,)
        ctx.results = [(r.shape, r.dtype) for r in results]

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        primals = ctx.saved_tensors
        if any(p.is_complex() for p in primals) or any(d.is_complex for _, d in ctx.results):
            # JAX's VJP of a complex function is the conjugate of PyTorch's convention.
            raise RuntimeError(f"{qualname}: gradients through complex tensors are not supported")
        device = primals[0].device if primals else torch.device("cpu")
        grads = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                 for g, (shape, dtype) in zip(grads, ctx.results)]
        result = backward_op(*primals, *grads, *ctx.statics)
        result = (result,) if n == 1 else tuple(result)
        return (*(g if p.is_floating_point() else None for g, p in zip(result, primals)),
                *([None] * len(ctx.statics)))

    torch.library.register_autograd(qualname, backward, setup_context=setup_context)


_ELEMENT_TYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
                  "i32": torch.int32, "i64": torch.int64, "i16": torch.int16, "i8": torch.int8, "ui8": torch.uint8,
                  "ui16": torch.uint16, "ui32": torch.uint32, "ui64": torch.uint64,
                  "i1": torch.bool, "complex<f32>": torch.complex64, "complex<f64>": torch.complex128}


def _tensor_types(qualname: str, types: Any, what: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    from jax._src.lib.mlir import ir

    found = []
    for t in types:
        ranked = ir.RankedTensorType(t)
        element = str(ranked.element_type)
        if element not in _ELEMENT_TYPES:
            raise TypeError(f"{qualname}: no torch dtype for the {what} element type {element}")
        found.append((tuple(ranked.shape), _ELEMENT_TYPES[element]))
    return found


def stablehlo_op(qualname: str, text: str, outputs: Sequence[tuple[Sequence[int], torch.dtype]],
                 inputs: Sequence[str] | None = None) -> Any:
    """Registers StableHLO text (a module, or func.func definitions with a public @main)
    as operator `qualname`; its inputs are @main's (one fixed signature), `outputs` each
    result's shape and dtype, `inputs` optionally their names. No autograd and no CPU
    kernel: it runs on pjrt only."""
    _jax()
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    namespace, name = _split(qualname)
    with mlir.make_ir_context() as context:
        try:
            module = ir.Module.parse(text, context)
        except Exception as e:
            raise RuntimeError(f"{qualname}: the StableHLO text does not parse: {e}") from e
        entries = [op for op in module.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == "main"]
        if not entries:
            raise RuntimeError(f"{qualname}: the StableHLO text has no @main function")
        function_type = ir.FunctionType(ir.TypeAttr(entries[0].attributes["function_type"]).value)
        expected = _tensor_types(qualname, function_type.inputs, "input")
        results = _tensor_types(qualname, function_type.results, "result")
        declared = [(tuple(shape), dtype) for shape, dtype in outputs]
        if declared != results:
            raise ValueError(f"{qualname}: outputs {declared} do not match @main's results {results}")
        if not expected:
            raise ValueError(f"{qualname}: an operator from StableHLO needs at least one tensor input")
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        symbol, body = _private_functions(module, "k_" + qualname.replace("::", "_") + "_" + digest)
    _C._define_kernel(symbol, body)
    names = list(inputs) if inputs is not None else [f"x{i}" for i in range(len(expected))]
    if len(names) != len(expected):
        raise ValueError(f"{qualname}: {len(names)} input names for {len(expected)} inputs")
    lib = _library(namespace)
    returns = _returns(len(outputs))
    lib.define(f"{name}({', '.join('Tensor ' + n for n in names)}) -> {returns}")

    def check(tensors: Sequence[torch.Tensor]) -> None:
        got = [(tuple(t.shape), t.dtype) for t in tensors]
        if got != expected:
            raise RuntimeError(f"{qualname}: expected inputs {expected}, got {got}")

    def on_pjrt(*tensors: torch.Tensor) -> Any:
        check(tensors)
        like = [torch.empty(tuple(shape), dtype=dtype, device="meta") for shape, dtype in outputs]
        outs = _C._call_kernel(qualname, symbol, list(tensors), like)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def fake(*tensors: torch.Tensor) -> Any:
        check(tensors)
        outs = [torch.empty(tuple(shape), dtype=dtype, device=tensors[0].device) for shape, dtype in outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    lib.impl(name, on_pjrt, "PrivateUse1")
    torch.library.register_fake(qualname, fake, lib=lib)
    return getattr(getattr(torch.ops, namespace), name)
