"""Where a mismatch starts: python -m torch_pjrt.tools.zoo.locate TYPE [--mode strict]

Runs the architecture's model forward and backward on the CPU (float32, float64) and on
pjrt with a hook on every module, and judges each module call's floating outputs
against float64 with the sweep's bound. Prints the module calls beyond the bound, in
execution order, marking START those whose inputs were all within theirs (the mismatch
starts there: a leaf module names the op family); when the forward is within bounds,
the parameter gradients beyond theirs, last parameter first (roughly the backward's
order: the first listed is nearest where the backward parts). A diagnostic for the
report's mismatches; nothing is written.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from torch_pjrt.qualify.differential import FACTOR, Comparison  # noqa: E402

from . import build, catalog, execute, inputs, judge  # noqa: E402


@dataclass
class Trace:
    """Per module call (name#k): floating outputs, floating inputs, gradients w.r.t. its inputs."""

    outputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    inputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    grads: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    run: execute.Run | None = None


def _floats(value: Any) -> list[torch.Tensor]:
    return [t for t in execute.flatten(value).values() if t.is_floating_point()]


def _cpu(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().to("cpu", torch.float64) for t in ts]


def traced_run(model: torch.nn.Module, x: dict[str, Any]) -> Trace:
    trace = Trace()
    calls: dict[str, int] = {}
    handles = []

    def hook(name: str):
        def forward_hook(module: torch.nn.Module, args: Any, kwargs: Any, out: Any) -> None:
            k = calls.get(name, 0)
            calls[name] = k + 1
            key = f"{name or '<model>'}#{k}"
            trace.order.append(key)
            trace.outputs[key] = _cpu(_floats(out))
            trace.inputs[key] = _cpu(_floats((args, kwargs)))
        return forward_hook

    for name, module in model.named_modules():
        handles.append(module.register_forward_hook(hook(name), with_kwargs=True))
    try:
        trace.run = execute.run(model, model, x)
    finally:
        for h in handles:
            h.remove()
    return trace


def _within(device: list[torch.Tensor], exact: list[torch.Tensor], f32: list[torch.Tensor]) -> tuple[bool, float]:
    if len(device) != len(exact) or len(f32) != len(exact):
        return False, float("inf")
    c = Comparison()
    for i, (d, e, f) in enumerate(zip(device, exact, f32)):
        judge.judge_tensor(c, str(i), d, e, f, FACTOR)
    return c.passed, c.worst_ratio


def locate(model_type: str, mode: str, limit: int = 20) -> list[str]:
    import torch_pjrt

    entry = catalog.entry(model_type)
    model, config = build.build(entry)
    x = inputs.make_inputs(model, config, entry.head, entry.model_type)
    t32 = traced_run(copy.deepcopy(model), x)
    t64 = traced_run(build.float64_copy(model), inputs.move(x, "cpu", torch.float64))
    with torch_pjrt.eager_mode(mode):
        tdev = traced_run(copy.deepcopy(model).to("pjrt"), inputs.move(x, "pjrt"))
    lines = []
    for key in t64.order:
        if key not in tdev.outputs or key not in t32.outputs:
            continue
        ok, ratio = _within(tdev.outputs[key], t64.outputs[key], t32.outputs[key])
        if ok:
            continue
        inputs_ok, _ = _within(tdev.inputs[key], t64.inputs[key], t32.inputs[key])
        cls = type(model.get_submodule(key.rsplit("#", 1)[0].replace("<model>", ""))).__name__
        lines.append(f"{'START ' if inputs_ok else '      '}{key} ({cls}): outputs {ratio:.3g} x bound"
                     + (" with every input within its bound" if inputs_ok else ""))
        if len(lines) >= limit:
            break
    if lines:
        return lines
    lines.append("every module call's outputs are within their bounds; parameter gradients beyond theirs:")
    assert tdev.run is not None and t64.run is not None and t32.run is not None
    for name in reversed(list(t64.run.grads)):
        exact, got, f32 = t64.run.grads[name], tdev.run.grads.get(name), t32.run.grads.get(name)
        if exact is None or got is None or f32 is None:
            continue
        ok, ratio = _within([got], [exact], [f32])
        if not ok:
            lines.append(f"      {name}: {ratio:.3g} x bound")
        if len(lines) > limit:
            break
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.tools.zoo.locate")
    p.add_argument("model_type")
    p.add_argument("--mode", default="strict", choices=["strict", "fused"])
    p.add_argument("--limit", type=int, default=20)
    args = p.parse_args(argv)
    for line in locate(args.model_type, args.mode, args.limit):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
