"""torch.compile(backend="pjrt"): AOTAutograd graphs captured as one program each and
replayed; every semantic point checked against CPU eager (or pjrt eager where the
result is the device's own, such as its random numbers)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, compiled_stats

import torch_pjrt


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def metric(name: str) -> int:
    return torch_pjrt.metrics()[name]


def compile_pjrt(fn):
    return torch.compile(fn, backend="pjrt", dynamic=False)


def test_backend_found_after_import_torch_alone():
    code = textwrap.dedent("""
        import torch
        assert "pjrt" in torch._dynamo.list_backends(), torch._dynamo.list_backends()
        f = torch.compile(lambda x: x * 2 + 1, backend="pjrt")
        print(f(torch.ones(3, device="pjrt")).cpu().tolist())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[3.0, 3.0, 3.0]"


def test_training_step_is_one_program_per_graph_and_replays_without_dispatch(dev):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(ref).to(dev)

    def loss_of(m, x):
        return (m(x) ** 2).mean()

    step = compile_pjrt(loss_of)
    seed = torch.ones((), device=dev)  # backward()'s own seed would be one eager op
    for i in range(3):
        x = torch.randn(5, 8)
        if i == 2:  # steady state: the forward and backward programs replay
            recorded, runs = metric("ops_recorded"), metric("compiled_runs")
        model.zero_grad()
        loss = step(model, x.to(dev))
        loss.backward(seed)
        ref.zero_grad()
        loss_ref = loss_of(ref, x)
        loss_ref.backward()
        assert_close(loss, loss_ref)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert_close(p.grad, q.grad)
    assert metric("ops_recorded") == recorded  # no ATen op was recorded, one by one, in the replay
    assert metric("compiled_runs") == runs + 2  # forward + backward
    s = compiled_stats()
    assert s["programs"] == 2 and s["eager_graphs"] == [] and s["recompiles"] == 0, s


def test_input_mutation_reaches_every_view_of_the_storage(dev):
    def f(x, y):
        x.add_(y)
        return x * 2

    fc = compile_pjrt(f)
    base = torch.zeros(4, 4, device=dev)
    row = base[1]  # the caller's own view of the mutated storage
    ones = torch.ones(4, 4, device=dev)
    for k in (1, 2):
        out = fc(base, ones)
        assert_close(out, torch.full((4, 4), 2.0 * k))
        assert_close(base, torch.full((4, 4), float(k)))
        assert_close(row, torch.full((4,), float(k)))
    # A view as the graph's input: the write lands in the caller's storage at its place.
    big = torch.zeros(6, 4, device=dev)
    ref = torch.zeros(6, 4)
    for _ in range(2):
        fc(big[2:4], ones[:2])
        f(ref[2:4], torch.ones(2, 4))
    assert_close(big, ref)
    assert compiled_stats()["eager_graphs"] == []


def test_outputs_that_alias_inputs_are_views_of_them(dev):
    def f(x):
        return x.t(), x[1:], x, x + 1, x.sum()

    fc = compile_pjrt(f)
    x_cpu = torch.arange(12.0).reshape(3, 4)
    for _ in range(2):
        x = x_cpu.to(dev)
        outs = fc(x)
        for got, want in zip(outs, f(x_cpu)):
            assert_close(got, want)
        t, tail, same, _, _ = outs
        assert same is x
        x.mul_(10)  # the aliases see a later write to their base
        assert_close(t, x_cpu.t() * 10)
        assert_close(tail, x_cpu[1:] * 10)


def test_multiple_and_requires_grad_outputs(dev):
    w_cpu = torch.randn(4, 3, requires_grad=True)
    w = w_cpu.detach().to(dev).requires_grad_()

    def f(x, w):
        h = x @ w
        return h.relu(), h.sigmoid(), h.detach().argmax(-1)

    fc = compile_pjrt(f)
    x_cpu = torch.randn(5, 4)
    a, b, idx = fc(x_cpu.to(dev), w)
    ra, rb, ridx = f(x_cpu, w_cpu)
    assert a.requires_grad and b.requires_grad and not idx.requires_grad
    assert_close(a, ra)
    assert_close(b, rb)
    assert torch.equal(idx.cpu(), ridx)
    (a.sum() + (b * b).sum()).backward()
    (ra.sum() + (rb * rb).sum()).backward()
    assert_close(w.grad, w_cpu.grad)


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_no_grad_and_inference_mode(dev, context):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    model = compile_pjrt(copy.deepcopy(ref).to(dev))
    ctx = torch.no_grad if context == "no_grad" else torch.inference_mode
    x = torch.randn(3, 8)
    for _ in range(2):
        with ctx():
            out = model(x.to(dev))
        assert not out.requires_grad
        with torch.no_grad():
            assert_close(out, ref(x))
    assert compiled_stats()["programs"] == 1


def test_batchnorm_running_statistics_in_train_and_eval(dev):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    model = copy.deepcopy(ref).to(dev)
    compiled = compile_pjrt(model)
    for step in range(3):
        x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(step))
        out = compiled(x.to(dev))
        out.sum().backward()
        want = ref(x)
        want.sum().backward()
        assert_close(out, want, rtol=1e-4, atol=1e-5)
    for (name, b), (_, rb) in zip(model.named_buffers(), ref.named_buffers()):
        if b.is_floating_point():
            assert_close(b, rb, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(b.cpu(), rb), name
    model.eval()
    ref.eval()
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        assert_close(compiled(x.to(dev)), ref(x), rtol=1e-4, atol=1e-5)


def test_random_ops_draw_from_the_pjrt_generator(dev):
    def f(x):
        return F.dropout(x, 0.3, training=True), torch.rand(5, device=x.device)

    fc = compile_pjrt(f)
    x = torch.ones(4096, device=dev)
    torch.manual_seed(3)
    eager = [t.cpu() for t in f(x) + f(x)]
    torch.manual_seed(3)
    compiled = [t.cpu() for t in fc(x) + fc(x)]
    # The program threads the generator's state: the same numbers as eager ops, advancing per call.
    for got, want in zip(compiled, eager):
        assert torch.equal(got, want)
    assert not torch.equal(compiled[0], compiled[2])
    dropped = (compiled[0] == 0).float().mean().item()
    assert abs(dropped - 0.3) < 0.05, dropped
    torch.manual_seed(3)
    again = fc(x)[0].cpu()
    assert torch.equal(again, compiled[0])  # reproducible under manual_seed
    assert compiled_stats()["programs"] == 1


def test_op_without_kernel_runs_eagerly_between_compiled_parts(dev):
    def f(x, w):
        y = torch.relu(x @ w)
        z = torch.special.airy_ai(y)  # no pjrt kernel: the CPU fallback
        return (z * 2 + y).sum(0)

    fc = compile_pjrt(f)
    x, w = torch.rand(4, 8), torch.rand(8, 8)
    for _ in range(3):
        assert_close(fc(x.to(dev), w.to(dev)), f(x, w), rtol=1e-5, atol=1e-5)
    s = compiled_stats()
    assert s["programs"] == 2, s  # the parts before and after the fallback
    assert s["calls"] == 4, s  # calls 2 and 3 ran each part once (the first call was the eager capture)
    assert any("special_airy_ai" in why for why in s["eager_graphs"]), s
    assert torch_pjrt.metrics()["fallbacks"].get("aten::special_airy_ai.out", 0) >= 3

    torch._dynamo.reset()
    with torch_pjrt.fallback_mode("error"), pytest.raises(Exception, match="special_airy_ai"):
        compile_pjrt(f)(x.to(dev), w.to(dev))


def test_graph_break_runs_the_eager_path(dev):
    def f(x):
        y = x.sin()
        if y.sum().item() > 0:  # a host read: Dynamo breaks the graph here
            y = y * 2
        return y.cos()

    fc = compile_pjrt(f)
    for sign in (1.0, -1.0):
        x = torch.full((6,), sign)
        assert_close(fc(x.to(dev)), f(x))


def test_compiled_optimizer_step_matches_cpu_and_donates(dev):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    model = copy.deepcopy(ref).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    step = compile_pjrt(opt.step)
    for i in range(4):
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(i))
        opt.zero_grad()
        model(x.to(dev)).square().mean().backward()
        if i == 3:
            donated = metric("donated_buffers")
        step()
        opt_ref.zero_grad()
        ref(x).square().mean().backward()
        opt_ref.step()
    # Adam divides by sqrt(v): a near-zero gradient's rounding moves an element by up to
    # ~1e-6 here; 1e-5 is still a thousandth of the 4 * lr the steps could move it.
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_close(p, q, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert opt.state[p]["step"].item() == opt_ref.state[q]["step"].item() == 4
    # Parameters and both moment estimates are overwritten in place: their buffers are donated.
    assert metric("donated_buffers") - donated >= 3 * len(list(model.parameters()))


def test_recompiles_are_counted_with_the_shapes_that_caused_them(dev):
    fc = compile_pjrt(lambda x: (x * 3).sum(-1))
    for n in (2, 3, 5, 3):
        x = torch.randn(n, 4)
        assert_close(fc(x.to(dev)), (x * 3).sum(-1))
    s = compiled_stats()
    assert s["dynamo_graphs"] == 3 and s["recompiles"] == 2, s
    assert [shape[0] for shape in s["shapes"]] == [(2, 4), (3, 4), (5, 4)], s


def test_second_process_starts_warm_from_the_disk_cache(tmp_path):
    script = textwrap.dedent("""
        import json, torch, torch_pjrt
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("pjrt")
        step = torch.compile(lambda x: model(x).square().mean(), backend="pjrt")
        loss = step(torch.ones(8, 16, device="pjrt"))
        loss.backward()
        m = torch_pjrt.metrics()
        print(json.dumps({"loss": loss.item(), "compiles": m["compiles"], "disk": m["disk_cache_hits"],
                          "grad": model[0].weight.grad.sum().item()}))
    """)
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(tmp_path / "cache"))

    def run() -> dict:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        import json

        return json.loads(out.stdout.strip().splitlines()[-1])

    cold, warm = run(), run()
    assert cold["compiles"] >= 2, cold  # at least the forward and backward programs
    assert warm["compiles"] == 0 and warm["disk"] >= cold["compiles"], warm
    assert warm["loss"] == cold["loss"] and warm["grad"] == cold["grad"]


def test_storm_guard_warns_once_naming_the_varying_dim_and_buckets(dev):
    fc = compile_pjrt(lambda x: x.cos() * 2)
    previous = torch_pjrt.set_recompile_policy(limit=3, action="warn")
    try:
        with pytest.warns(UserWarning, match=r"input 0 dim 0 takes \[1, 2, 3, 5\], e.g. buckets \[1, 2, 4, 8\]"):
            for n in (1, 2, 3, 5):
                fc(torch.ones(n, 7, device=dev))
        s = compiled_stats()
        assert "4 distinct input shapes" in s["storm"], s
        assert "torch_pjrt.shapes.mark_bounded(x, dim, max)" in s["storm"], s
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per function: the next shapes do not warn again
            fc(torch.ones(6, 7, device=dev))
        torch._dynamo.reset()
        torch_pjrt.reset_metrics()
        torch_pjrt.set_recompile_policy(action="error")
        fe = compile_pjrt(lambda x: x.sin())
        for n in (1, 2, 3):
            fe(torch.ones(n, device=dev))
        with pytest.raises(torch_pjrt.RecompileError, match="distinct input shapes"):
            fe(torch.ones(4, device=dev))
    finally:
        torch_pjrt.set_recompile_policy(previous.limit, previous.action)


def test_recompile_env_is_validated():
    out = subprocess.run([sys.executable, "-c", "import torch_pjrt"], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TORCH_PJRT_RECOMPILE="sometimes"))
    assert out.returncode != 0 and "TORCH_PJRT_RECOMPILE must be warn or error" in out.stderr


def test_dynamic_shapes_specialize_one_program_per_size(dev):
    fc = torch.compile(lambda x: (x * x).sum(0), backend="pjrt", dynamic=True)
    for n in (3, 5, 3, 5):
        x = torch.randn(n, 4)
        assert_close(fc(x.to(dev)), (x * x).sum(0))
    s = compiled_stats()
    assert s["dynamo_graphs"] == 1, s  # one symbolic Dynamo graph ...
    assert s["programs"] == 2 and s["eager_graphs"] == [], s  # ... specialized per size
    # Replays of a size seen before bind and run: no host read, no new program.
    x = torch.randn(5, 4)
    x_dev = x.to(dev)
    before = torch_pjrt.metrics()
    y = fc(x_dev)
    after = torch_pjrt.metrics()
    assert after["device_to_host_bytes"] == before["device_to_host_bytes"], "a replay read from the device"
    assert after["compiled_runs"] == before["compiled_runs"] + 1 and compiled_stats()["programs"] == 2
    assert_close(y, (x * x).sum(0))


@pytest.mark.parametrize("mode", ["strict", "fused", "compiled"])
def test_float32_matmul_precision_is_carried_into_the_program(dev, tmp_path, monkeypatch, mode):
    monkeypatch.setenv("TORCH_PJRT_DUMP_DIR", str(tmp_path))
    previous = torch.get_float32_matmul_precision()
    torch_pjrt.set_eager_mode("fused" if mode == "fused" else "strict")
    fn = (lambda a, b: a @ b) if mode != "compiled" else compile_pjrt(lambda a, b: a @ b)
    try:
        for k, (setting, expected) in enumerate([("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")]):
            torch.set_float32_matmul_precision(setting)
            n = 5 + k + 10 * ["strict", "fused", "compiled"].index(mode)
            a, b = torch.randn(3, n), torch.randn(n, 2)  # a new shape: a new program to read
            before = set(os.listdir(tmp_path))
            assert_close(fn(a.to(dev), b.to(dev)), a @ b)
            new = [f for f in os.listdir(tmp_path) if f not in before]
            texts = [open(os.path.join(tmp_path, f)).read() for f in new]
            dots = [t for t in texts if "stablehlo.dot_general" in t]
            assert dots, new
            assert all(f"precision {expected}" in t for t in dots), (setting, dots[0][:2000])
    finally:
        torch.set_float32_matmul_precision(previous)


def test_windows_of_a_storage_read_and_written_inside_a_program(dev):
    """Non-dense views (chunks of the last dim, every other row) inside a captured graph:
    its offsets are constants, so they lower to static slices of the storage."""
    def f(base, y):
        q, k, v = base.chunk(3, dim=-1)      # windows at three offsets
        base[:, 1:3, 2:4].add_(y)            # a write into a window of the input
        return (q * 2 + k.sin()).sum(-1), v[:, ::2].cos(), base[:, :, 5:]

    fc = compile_pjrt(f)
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        base_cpu, y_cpu = torch.randn(2, 4, 9, generator=g), torch.randn(2, 2, 2, generator=g)
        base = base_cpu.to(dev)
        outs = fc(base, y_cpu.to(dev))
        want = f(base_cpu, y_cpu)
        for got, exp in zip(outs, want):
            assert_close(got, exp, rtol=1e-6, atol=1e-6)
        assert_close(base, base_cpu)
    assert compiled_stats()["eager_graphs"] == [] and compiled_stats()["programs"] == 1


def test_inputs_that_share_a_storage(dev):
    """Inputs that are views of one storage: one parameter, and a write through one
    input is seen by the other as in eager."""
    def f(a, b):
        a.mul_(2)
        return a + b

    fc = compile_pjrt(f)
    for _ in range(2):
        base_cpu = torch.arange(8.0)
        base = base_cpu.to(dev)
        want = f(base_cpu[:4], base_cpu[2:6])  # overlapping: b sees a's write to its first two elements
        assert_close(fc(base[:4], base[2:6]), want)
        assert_close(base, base_cpu)
    g = compile_pjrt(lambda x, y: (x * 2).add_(y))
    s_cpu = torch.arange(6.0)
    s = s_cpu.to(dev)
    assert_close(g(s[:3], s[3:]), s_cpu[:3] * 2 + s_cpu[3:])
    assert_close(g(s[:3], s[:3]), s_cpu[:3] * 3)  # the same view twice


def test_out_of_range_index_inside_a_program_raises_at_the_sync(dev):
    emb = torch.nn.Embedding(10, 4).to(dev)
    fc = compile_pjrt(lambda ids: emb(ids).sum())
    fc(torch.tensor([1, 2], device=dev))
    torch_pjrt.synchronize()
    before = emb.weight.detach().cpu().clone()
    out = fc(torch.tensor([1, 12], device=dev))  # 12 is out of range
    with pytest.raises(IndexError, match="out of (range|bounds)"):
        torch_pjrt.synchronize()
    assert torch.equal(emb.weight.detach().cpu(), before)  # nothing the caller had was lost
    del out


def test_a_view_the_fake_strides_allowed_runs(dev: torch.device) -> None:
    # The backward's softplus_backward takes a transposed gradient: its fake (decomposed)
    # result is contiguous, its kernel's (the CPU's as pjrt's) follows the gradient, and the
    # traced view back to the input's shape cannot be taken as a view (Qwen3-Next, OLMo-hybrid).
    def f(inp: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        s = F.softplus(inp.view(2, 16, 32))
        return (s.transpose(1, 2) * c).sum()

    gen = torch.Generator().manual_seed(0)
    inp, c = torch.randn(2, 512, generator=gen), torch.randn(2, 32, 16, generator=gen)
    ref = inp.clone().requires_grad_()
    f(ref, c).backward()
    x = inp.to(dev).requires_grad_()
    torch.compile(f, backend="pjrt")(x, c.to(dev)).backward()
    torch.testing.assert_close(x.grad.cpu(), ref.grad)


def test_default_backend_compiles_device_graphs_with_pjrt_and_trains_like_cpu(dev):
    # torch.compile(model) with no backend is inductor, which has no code generator for the
    # device: graphs on pjrt go to backend="pjrt"; a CPU graph stays with inductor.
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(ref).to(dev)
    compiled = torch.compile(model)
    opt, opt_ref = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for i in range(3):
        x = torch.randn(5, 8)
        if i == 2:
            runs = metric("compiled_runs")
        loss = (compiled(x.to(dev)) ** 2).mean()
        loss_ref = (ref(x) ** 2).mean()
        loss.backward()
        loss_ref.backward()
        assert_close(loss, loss_ref)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert_close(p.grad, q.grad)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert_close(p, q)
    assert compiled_stats()["dynamo_graphs"] == 1 and metric("compiled_runs") == runs + 2  # pjrt's forward and backward
    made_on_device = torch.compile(lambda n: torch.arange(n, device=dev) * 3)  # no device input
    assert_close(made_on_device(4), torch.arange(4) * 3)
    with pytest.warns(UserWarning, match="do not apply"):
        torch.compile(model, mode="max-autotune")(torch.ones(2, 8, device=dev))
    runs = metric("compiled_runs")
    on_cpu = torch.compile(lambda t: t.sin() * 2)
    torch.testing.assert_close(on_cpu(torch.ones(3)), torch.ones(3).sin() * 2)
    assert metric("compiled_runs") == runs  # inductor ran it
