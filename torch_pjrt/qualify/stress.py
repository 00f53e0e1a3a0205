"""Kernel and buffer checks: float32 dots and convolutions across the sizes where
libraries switch kernels, in-place updates (buffer donation) followed by reads,
views of updated buffers, buffers freed and reallocated between calls, and
asynchronous execution.

Results are judged against float64 with the classic worst-case bound of a
float32 sum of K products in any order, |error| <= K * eps * (|A| @ |B|)
(Higham, "Accuracy and Stability of Numerical Algorithms", 3.1): it holds on
every CPU and kernel, and a kernel reading stale or wrong data is far outside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

EPS32 = torch.finfo(torch.float32).eps
FACTOR = 8.0  # where the bound is float32's own error (a chain of dependent steps): this many times it

# (m, k, n) of x @ w: tiny, odd, the [16, 4096] range where XLA CPU's cost model may pick
# XNNPACK/YNNPACK, and past the point where Eigen changes its blocking.
DOT_SIZES = [(1, 7, 5), (3, 4, 3), (17, 33, 65), (32, 16, 32), (64, 64, 64), (192, 384, 96), (192, 96, 384),
             (128, 256, 512), (47, 96, 384), (256, 1024, 256), (512, 512, 512), (8, 2048, 8)]


def _rand(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


class Judge:
    """Collects float32 results against float64 references and their bounds."""

    def __init__(self) -> None:
        self.worst = 0.0  # max error / bound seen
        self.count = 0

    def check(self, what: str, device_result: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor) -> None:
        got = device_result.detach().to("cpu").double()
        if got.shape != exact.shape:
            raise AssertionError(f"{what}: shape {tuple(got.shape)}, expected {tuple(exact.shape)}")
        err = (got - exact).abs()
        allowed = bound + 4 * EPS32 * exact.abs()  # plus the final rounding to float32
        self.count += 1
        if not torch.isfinite(got).all():
            raise AssertionError(f"{what}: non-finite values where float64 is finite")
        ratio = (err / allowed.clamp_min(torch.finfo(torch.float32).tiny)).max().item()
        self.worst = max(self.worst, ratio)
        if ratio > 1:
            i = int((err - allowed).flatten().argmax())
            raise AssertionError(
                f"{what}: max error {err.max().item():.3g} ("
                f"{err.max().item() / max(exact.abs().max().item(), 1e-300):.2g} of the largest value); at element {i}: device "
                f"{got.flatten()[i].item():.9g}, float64 {exact.flatten()[i].item():.9g}, allowed "
                f"{allowed.flatten()[i].item():.3g}")

    def summary(self, what: str) -> str:
        return f"{self.count} {what}, worst error {self.worst:.2g} of the bound"


def dot_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k = a.shape[-1]
    return k * EPS32 * (a.abs() @ b.abs())


def _f32(t: torch.Tensor, device: str) -> torch.Tensor:
    return t.to(device=device, dtype=torch.float32)


def _exact(t: torch.Tensor) -> torch.Tensor:
    """The float64 value of a float32-rounded tensor (the device sees the rounded inputs)."""
    return t.float().double()


def dots(device: str) -> str:
    """float32 matmul, x @ w and x @ w.T (nn.Linear's form), and batched, across sizes."""
    judge = Judge()
    for i, (m, k, n) in enumerate(DOT_SIZES):
        x, w = _exact(_rand((m, k), 10 + i)), _exact(_rand((k, n), 50 + i))
        judge.check(f"matmul {m}x{k} @ {k}x{n}", _f32(x, device) @ _f32(w, device), x @ w, dot_bound(x, w))
        wt = w.t().contiguous()
        judge.check(f"linear {m}x{k} with weight {n}x{k}", F.linear(_f32(x, device), _f32(wt, device)), x @ w,
                    dot_bound(x, w))
    a, b = _exact(_rand((6, 96, 128), 90)), _exact(_rand((6, 128, 80), 91))
    judge.check("bmm 6x96x128 @ 6x128x80", torch.bmm(_f32(a, device), _f32(b, device)), a @ b, dot_bound(a, b))
    return judge.summary("products")


def convolutions(device: str) -> str:
    """conv2d forward and both gradients across channel counts, kernels, strides and groups."""
    judge = Judge()
    cases = [(1, 3, 8, 8, 4, 3, 1, 1), (4, 16, 16, 16, 32, 3, 1, 1), (2, 32, 15, 15, 64, 3, 2, 1),
             (2, 64, 8, 8, 64, 1, 1, 1), (2, 96, 12, 12, 96, 3, 1, 96), (1, 8, 33, 33, 16, 5, 2, 2)]
    for i, (nb, cin, h, wd, cout, ks, stride, groups) in enumerate(cases):
        x = _exact(_rand((nb, cin, h, wd), 100 + i))
        w = _exact(_rand((cout, cin // groups, ks, ks), 200 + i))
        pad = ks // 2
        what = f"conv2d {nb}x{cin}x{h}x{wd}, {cout} filters {ks}x{ks}, stride {stride}, groups {groups}"
        k = (cin // groups) * ks * ks
        exact = F.conv2d(x, w, stride=stride, padding=pad, groups=groups)
        bound = k * EPS32 * F.conv2d(x.abs(), w.abs(), stride=stride, padding=pad, groups=groups)
        xd, wdv = _f32(x, device).requires_grad_(), _f32(w, device).requires_grad_()
        out = F.conv2d(xd, wdv, stride=stride, padding=pad, groups=groups)
        judge.check(what, out, exact, bound)
        g = _exact(_rand(tuple(exact.shape), 300 + i))
        out.backward(_f32(g, device))
        x64, w64 = x.clone().requires_grad_(), w.clone().requires_grad_()
        F.conv2d(x64, w64, stride=stride, padding=pad, groups=groups).backward(g)
        # Gradients are sums of products too: bound them by the same rule on absolute values.
        xa, wa = x.abs().requires_grad_(), w.abs().requires_grad_()
        F.conv2d(xa, wa, stride=stride, padding=pad, groups=groups).backward(g.abs())
        n_in = cout // groups * ks * ks
        n_w = nb * exact.shape[2] * exact.shape[3]
        judge.check(what + " (input gradient)", xd.grad, x64.grad, n_in * EPS32 * xa.grad)
        judge.check(what + " (weight gradient)", wdv.grad, w64.grad, n_w * EPS32 * wa.grad)
    return judge.summary("convolution results")


# Pointwise ops with their input ranges: every branch of their approximations (|x| < 1 and > 1,
# both signs), at sizes past the vector width, out of place and in place.
POINTWISE = {
    "exp": (-20, 20), "expm1": (-3, 3), "log": (1e-3, 1e3), "log1p": (-0.9, 10), "sqrt": (0, 100),
    "rsqrt": (1e-2, 100), "sin": (-10, 10), "cos": (-10, 10), "tan": (-1.5, 1.5), "tanh": (-10, 10),
    "sigmoid": (-20, 20), "atan": (-10, 10), "asin": (-0.99, 0.99), "acos": (-0.99, 0.99), "sinh": (-5, 5),
    "cosh": (-5, 5), "asinh": (-10, 10), "acosh": (1.01, 10), "atanh": (-0.99, 0.99), "erf": (-4, 4),
    "erfc": (-4, 4), "erfinv": (-0.99, 0.99), "lgamma": (0.1, 10), "digamma": (0.1, 10), "reciprocal": (0.1, 10),
}


def pointwise(device: str) -> str:
    """Transcendental and other pointwise ops, float32, 1000 elements, against float64: within 8x
    CPU float32's own largest error plus 64 ulps of each value (approximations differ by a few ulps;
    a wrong branch or sign is off by the value itself)."""
    judge = Judge()
    for i, (name, (low, high)) in enumerate(POINTWISE.items()):
        x = torch.rand(1000, generator=torch.Generator().manual_seed(1100 + i), dtype=torch.float64)
        x = _exact(low + (high - low) * x)
        fn = getattr(torch, name)
        exact, cpu32 = fn(x), fn(x.float()).double()
        bound = FACTOR * (cpu32 - exact).abs().max() + 60 * EPS32 * exact.abs()
        judge.check(f"torch.{name} of 1000 float32 values in [{low}, {high}]", fn(_f32(x, device)), exact, bound)
        inplace = _f32(x, device).clone()
        getattr(inplace, name + "_")()
        judge.check(f"Tensor.{name}_ of 1000 float32 values in [{low}, {high}]", inplace, exact, bound)
    return judge.summary("pointwise results")


def inplace_then_read(device: str) -> str:
    """A weight updated in place (its buffer donated to the update: same memory, new values),
    then read by the same compiled matmul again: every read must see the new values."""
    judge = Judge()
    for i, (m, k, n) in enumerate(s for s in DOT_SIZES if s[0] > 1):
        x, w = _exact(_rand((m, k), 400 + i)), _exact(_rand((k, n), 500 + i))
        xd, wd = _f32(x, device), _f32(w, device)
        wtd = _f32(w.t().contiguous(), device)
        for r in range(3):
            judge.check(f"matmul {m}x{k} @ {k}x{n} after {r} in-place updates", xd @ wd, x @ w, dot_bound(x, w))
            judge.check(f"linear {m}x{k} (weight {n}x{k}) after {r} in-place updates", F.linear(xd, wtd), x @ w,
                        dot_bound(x, w))
            delta = _exact(_rand((k, n), 600 + 10 * i + r)) * 0.5
            wd.add_(_f32(delta, device))
            w = _exact(w + delta)
            wtd.add_(_f32(delta.t().contiguous(), device))  # the same float32 sums, transposed
    return judge.summary("products after in-place updates")


def views_of_updated(device: str) -> str:
    """Views read after their base was updated in place, and bases read after a view was."""
    judge = Judge()
    m, k, n = 192, 384, 96
    x, base = _exact(_rand((m, k), 700)), _exact(_rand((k, 2 * n), 701))
    xd, based = _f32(x, device), _f32(base, device)
    left = based[:, :n]
    judge.check("matmul with a view", xd @ left, x @ base[:, :n], dot_bound(x, base[:, :n]))
    based.mul_(2)
    base = base * 2
    judge.check("matmul with a view after its base was scaled in place", xd @ left, x @ base[:, :n],
                dot_bound(x, base[:, :n]))
    left.add_(1)
    base[:, :n] += 1
    judge.check("matmul with the base after its view was updated in place", xd @ based, x @ base,
                dot_bound(x, base))
    right_t = based[:, n:].t()
    judge.check("linear with a transposed view", F.linear(xd, right_t.contiguous()), x @ base[:, n:],
                dot_bound(x, base[:, n:]))
    return judge.summary("products through views")


def freed_and_reallocated(device: str) -> str:
    """New weights in buffers just freed: an allocator tends to hand the same memory back
    (a large block by mmap, a small one from its free lists), whether it does is its choice."""
    judge = Judge()
    for m, k, n in ((192, 384, 96), (64, 128, 96)):
        x = _exact(_rand((m, k), 800 + k))
        xd = _f32(x, device)
        for r in range(12):
            w = _exact(_rand((k, n), 900 + 20 * k + r))
            wd = _f32(w, device)
            judge.check(f"matmul {m}x{k} @ {k}x{n} with weights allocated in round {r}", xd @ wd, x @ w,
                        dot_bound(x, w))
            del wd
            torch_sync(device)
    return judge.summary("products with reallocated weights")


def torch_sync(device: str) -> None:
    getattr(torch, torch.device(device).type).synchronize()


def asynchronous(device: str) -> str:
    """Work enqueued without waiting: a long dependent chain, host reads in the middle,
    inputs overwritten and freed while programs that read them may still run."""
    judge = Judge()
    n = 256
    a, b = _exact(_rand((n, n), 1000)), _exact(_rand((n, n), 1001) / (2 * math.sqrt(n)))
    ad, bd = _f32(a, device), _f32(b, device)
    exact, cpu32 = a, a.float()
    chain = []
    for step in range(40):
        ad = torch.tanh(ad @ bd)
        exact, cpu32 = torch.tanh(exact @ b), torch.tanh(cpu32 @ b.float())
        # The bound: a few times CPU float32's own distance to float64 on this chain.
        chain.append((ad, exact, FACTOR * (cpu32.double() - exact).abs().max()))
        if step == 20:  # a host read in the middle of the chain
            judge.check("chain step 20 read while later work is queued", *chain[-1])
    torch_sync(device)
    for step in (0, 10, 39):
        judge.check(f"chain step {step} after synchronize", *chain[step])
    # Write-after-read: a program reading w is queued, then w is updated in place.
    x, w = _exact(_rand((192, 384), 1002)), _exact(_rand((384, 96), 1003))
    xd, wd = _f32(x, device), _f32(w, device)
    results = []
    for r in range(8):
        results.append((xd @ wd, x @ w))
        wd.mul_(-1)
        w = -w
    for r, (got, want) in enumerate(results):
        judge.check(f"product queued before in-place update {r}", got, want, dot_bound(x, w))
    return judge.summary("results of asynchronous work")


StressCheck = Callable[[str], str]
STRESS_CHECKS: dict[str, StressCheck] = {
    "dots": dots,
    "convolutions": convolutions,
    "pointwise": pointwise,
    "inplace-then-read": inplace_then_read,
    "views-of-updated": views_of_updated,
    "freed-and-reallocated": freed_and_reallocated,
    "asynchronous": asynchronous,
}
