"""float8 tensors on the device: conversions with torch's own rules (bit for bit against the
CPU, special values included), host copies, the ops torch's CPU has for them, and
torch._scaled_mm (torchao's float8 training and inference) against the CPU and float64."""

from __future__ import annotations

import copy

import pytest
import torch

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu]

# In range, ties, overflow (saturating for e4m3fn, infinity or NaN for the others), NaN,
# infinities, signed zero, subnormals and values below the smallest one.
SPECIAL = [0.0, -0.0, 1.0, -1.5, 0.3, 1.0625, 1.125, 3.5, 240.0, 241.0, 448.0, 449.0, 464.0, 500.0, -1000.0,
           57344.0, 61440.0, 1e6, -1e6, float("nan"), float("inf"), -float("inf"), 1e-9, 3e-5, 2.0 ** -9,
           2.0 ** -10, 2.0 ** -17, 1.5 * 2.0 ** -16, 0.0009765625, 65504.0]


def _bits(t: torch.Tensor) -> list[int]:
    return t.cpu().view(torch.uint8).tolist()


def _values(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(200, generator=g, dtype=torch.float64) * torch.logspace(-12, 12, 200, base=2.0,
                                                                                 dtype=torch.float64)
    return torch.cat([torch.tensor(SPECIAL, dtype=torch.float64), spread]).to(dtype)


@pytest.mark.parametrize("f8", FLOAT8, ids=str)
@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_conversion_to_float8_matches_cpu_bit_for_bit(dev: torch.device, f8: torch.dtype, source: torch.dtype) -> None:
    x = _values(source)
    assert _bits(x.to(dev).to(f8)) == _bits(x.to(f8))


@pytest.mark.parametrize("f8", FLOAT8, ids=str)
def test_conversions_from_float8_and_between_formats_match_cpu(dev: torch.device, f8: torch.dtype) -> None:
    x = _values(torch.float32).to(f8)  # every float8 value the CPU gives, NaN included
    d = x.to(dev)
    assert _bits(d) == _bits(x)  # the host copy keeps the bytes
    for target in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        torch.testing.assert_close(d.to(target).cpu(), x.to(target), rtol=0, atol=0, equal_nan=True)
    finite = x[x.float().isfinite()]
    for target in (torch.int64, torch.int32, torch.uint8, torch.bool):
        torch.testing.assert_close(finite.to(dev).to(target).cpu(), finite.to(target), rtol=0, atol=0)
    for other in FLOAT8:
        assert _bits(d.to(other)) == _bits(x.to(other)), other
    ints = torch.tensor([0, 1, -3, 17, 300, -5000, 100000], dtype=torch.int64)
    assert _bits(ints.to(dev).to(f8)) == _bits(ints.to(f8))


@pytest.mark.parametrize("f8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_the_ops_torch_has_for_float8_match_cpu(dev: torch.device, f8: torch.dtype) -> None:
    x = _values(torch.float32)[:64].reshape(8, 8).to(f8)
    y = torch.randn(8, 8, generator=torch.Generator().manual_seed(1)).to(f8)
    d, e = x.to(dev), y.to(dev)
    index = torch.tensor([5, 0, 7, 7])
    pairs = {
        "abs": (d.abs(), x.abs()),
        "mul": (d * e, x * y),
        "eq": (d.eq(e), x.eq(y)),
        "where": (torch.where(d.float() > 0, d, e), torch.where(x.float() > 0, x, y)),
        "index_select": (d.index_select(1, index.to(dev)), x.index_select(1, index)),
        "cat": (torch.cat([d, e.t()]), torch.cat([x, y.t()])),
        "transpose contiguous": (d.t().contiguous(), x.t().contiguous()),
        "view and slice": (d.view(4, 16)[1:3, ::3], x.view(4, 16)[1:3, ::3]),
        "clone": (d.clone(), x.clone()),
        "fill_": (d.clone().fill_(-2.75), x.clone().fill_(-2.75)),
        "zero_": (d.clone().zero_(), x.clone().zero_()),
        "full": (torch.full((3,), 300.0, dtype=f8, device=dev), torch.full((3,), 300.0, dtype=f8)),
        "zeros": (torch.zeros(3, dtype=f8, device=dev), torch.zeros(3, dtype=f8)),
    }
    for name, (got, want) in pairs.items():
        assert got.dtype == want.dtype and got.shape == want.shape, name
        if want.dtype == torch.bool:
            assert torch.equal(got.cpu(), want), name
        elif name == "abs":  # (torch's CPU float8 abs keeps -0.0's sign; IEEE's, and the device's, drop it)
            torch.testing.assert_close(got.cpu().float(), want.float(), rtol=0, atol=0, equal_nan=True, msg=name)
        else:
            assert _bits(got) == _bits(want), name


def _scaled_mm_reference(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                         bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(a * sa) @ (b * sb) + bias in float64, and the float32 computation's worst-case rounding bound."""
    a64, b64 = a.double() * sa.double(), b.double() * sb.double()
    exact = a64 @ b64 + (bias.double() if bias is not None else 0)
    k = a.shape[1]
    bound = (k + 2) * torch.finfo(torch.float32).eps * (a64.abs() @ b64.abs() + (bias.double().abs() if bias is not None else 0))
    return exact, bound


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scaling", ["tensor-wise", "row-wise"])
def test_scaled_mm_matches_float64_and_cpu(dev: torch.device, out_dtype: torch.dtype, scaling: str) -> None:
    g = torch.Generator().manual_seed(2)
    m, k, n = 24, 64, 40
    a = torch.randn(m, k, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, generator=g).to(torch.float8_e5m2).t()  # column-major, as torchao passes it
    if scaling == "tensor-wise":
        sa, sb = torch.tensor(0.37), torch.tensor(1.9)
    else:
        sa, sb = torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, n, generator=g) + 0.5
    bias = torch.randn(n, generator=g).to(out_dtype)
    got = torch._scaled_mm(a.to(dev), b.to(dev), sa.to(dev), sb.to(dev), bias=bias.to(dev), out_dtype=out_dtype)
    want = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype)
    assert got.dtype == out_dtype and got.shape == (m, n)
    exact, bound = _scaled_mm_reference(a, b, sa, sb, bias)
    if out_dtype != torch.float32:  # and the final rounding to out_dtype
        bound = bound + torch.finfo(out_dtype).eps * exact.abs()
    assert ((got.cpu().double() - exact).abs() <= bound).all()
    assert ((want.double() - exact).abs() <= bound).all()  # the bound holds for the CPU too


def test_scaled_mm_with_a_float8_result_scales_and_saturates(dev: torch.device) -> None:
    # The reference is the exact product, scaled and converted as torch's casts do (e4m3fn
    # saturating; a value in range converts the same on every path). Not CPU's own
    # _scaled_mm: on CPUs with AVX512-FP16 it goes through oneDNN, whose e4m3fn result
    # overflows to NaN, while its emulated path (other CPUs) and cuBLASLt saturate.
    a = torch.full((4, 8), 16.0).to(torch.float8_e4m3fn)
    b = torch.full((8, 4), 8.0).to(torch.float8_e4m3fn)
    exact = a.double() @ b.double()  # 1024 everywhere
    for scale_result, out_dtype, scale in ((None, torch.float8_e4m3fn, 1.0),  # 1024: saturates to 448
                                           (0.25, torch.float8_e4m3fn, 1.0),  # 4096: saturates
                                           (4.0, torch.float8_e4m3fn, 1.0),  # 256: in range
                                           (2.0, torch.float8_e5m2, 0.5),  # 128: in range
                                           (2.0 ** -7, torch.float8_e5m2, 1.0)):  # 2 ** 17: e5m2 overflows to inf
        s = torch.tensor(scale)
        got = torch._scaled_mm(a.to(dev), b.to(dev), s.to(dev), s.to(dev), out_dtype=out_dtype,
                               scale_result=None if scale_result is None else torch.tensor(scale_result).to(dev))
        value = exact * scale * scale / (1.0 if scale_result is None else scale_result)
        if out_dtype == torch.float8_e4m3fn:
            value = value.clamp(-448.0, 448.0)
        assert got.dtype == out_dtype
        assert _bits(got) == _bits(value.to(out_dtype)), (scale_result, out_dtype)


def test_scaled_mm_bad_input_raises_as_the_cpu_does(dev: torch.device) -> None:
    a = torch.ones(4, 8, dtype=torch.float8_e4m3fn, device=dev)
    b = torch.ones(8, 4, dtype=torch.float8_e4m3fn, device=dev)
    one = torch.tensor(1.0, device=dev)
    with pytest.raises(RuntimeError, match="_scaled_mm: expected float8 inputs"):
        torch._scaled_mm(a.float(), b, one, one)
    with pytest.raises(RuntimeError, match="invalid scaling configuration"):
        torch._scaled_mm(a, b, one.double(), one)
    with pytest.raises(RuntimeError, match="invalid scaling configuration"):
        torch._scaled_mm(a, b, torch.ones(3, 1, device=dev), torch.ones(1, 4, device=dev))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch._scaled_mm(a, a, one, one)


def test_a_low_precision_format_the_device_does_not_hold_is_a_clear_error(dev: torch.device) -> None:
    with pytest.raises(TypeError, match="Float4_e2m1fn_x2 is not supported"):
        torch.empty(2, dtype=torch.float4_e2m1fn_x2).to(dev)


def test_e8m0fnu_conversions_match_cpu_on_every_byte_and_every_rounding_case(dev: torch.device) -> None:
    # e8m0fnu (MX scales: 2^(e - 127), 255 NaN): every byte widened, bit for bit in float32
    # (2^-127 is a float32 subnormal, NaN torch's 0x7f800001); and narrowed from every float32
    # exponent with the mantissas around its rounding cases (the guard bit alone: a tie; with
    # a bit below it; the largest), both signs (torch ignores the sign), from each source type.
    every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    on_device = every.to(dev)
    assert _bits(on_device) == _bits(every)
    assert torch.equal(on_device.to(torch.float32).cpu().view(torch.int32), every.to(torch.float32).view(torch.int32))
    for target in (torch.float64, torch.bfloat16, torch.float16):
        torch.testing.assert_close(on_device.to(target).cpu(), every.to(target), rtol=0, atol=0, equal_nan=True)
    patterns = [(sign << 31) | (exponent << 23) | mantissa for exponent in range(256) for sign in (0, 1)
                for mantissa in (0, 1, 0x1FFFFF, 0x200000, 0x3FFFFF, 0x400000, 0x400001, 0x600000, 0x7FFFFF)]
    x = torch.tensor(patterns, dtype=torch.int64).to(torch.int32).view(torch.float32)
    for source in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        values = x.to(source)
        got, want = _bits(values.to(dev).to(torch.float8_e8m0fnu)), _bits(values.to(torch.float8_e8m0fnu))
        wrong = [(values[i].item(), got[i], want[i]) for i in range(len(want)) if got[i] != want[i]]
        assert not wrong, f"from {source}: (value, got, want) {wrong[:8]}"
    # float64 values that float32 cannot hold: twice rounded by torch (to float32, then to the
    # exponent), the float32 subnormal range included
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(4000, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-152, 128, (4000,), generator=g).double())
    near_ties = torch.exp2(torch.arange(-150, 128).double()) * (1.5 + 2.0 ** -30)
    values = torch.cat([wide, near_ties, -near_ties])
    got, want = _bits(values.to(dev).to(torch.float8_e8m0fnu)), _bits(values.to(torch.float8_e8m0fnu))
    wrong = [(values[i].item(), got[i], want[i]) for i in range(len(want)) if got[i] != want[i]]
    assert not wrong, f"from float64: (value, got, want) {wrong[:8]}"


@pytest.mark.parametrize("recipe,compiled", [("tensorwise", False), ("rowwise", False), ("tensorwise", True)],
                         ids=["tensorwise", "rowwise", "tensorwise-compiled"])
def test_torchao_float8_training_matches_cpu_step_by_step(dev: torch.device, recipe: str, compiled: bool) -> None:
    # torchao's Float8Linear (dynamic scaling: amax, scale, cast to e4m3fn and e5m2,
    # torch._scaled_mm forward and backward) on the device, eager or compiled with
    # backend="pjrt", against the same recipe run by torchao on the CPU: every step's loss,
    # gradients and parameters, with no CPU fallback. The casts are torch's rules bit for
    # bit; float32 sums in another order can move a value across a float8 rounding boundary,
    # which changes it by at most one float8 step (2^-2 relative for e5m2): a wrong scale,
    # layout or cast is off by far more.
    import torch_pjrt
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 64, generator=g), torch.randn(32, 32, generator=g)) for _ in range(10)]
    runs = {}
    for device in ("cpu", dev):
        model = convert_to_float8_training(copy.deepcopy(base).to(device),
                                           config=Float8LinearConfig.from_recipe_name(recipe))
        assert type(model[0]).__name__ == "Float8Linear"
        step_fn = torch.compile(model, backend="pjrt") if compiled and device == dev else model
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        steps = []
        with torch_pjrt.fallback_mode("error"):
            for x, y in batches:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(step_fn(x.to(device)), y.to(device))
                loss.backward()
                opt.step()
                steps.append((loss.item(), [p.grad.cpu().clone() for p in model.parameters()],
                              [p.detach().cpu().clone() for p in model.parameters()]))
        runs[str(device)] = steps
    for step, (cpu, got) in enumerate(zip(runs["cpu"], runs[str(dev)])):
        assert got[0] == pytest.approx(cpu[0], rel=1e-3), f"step {step} loss"  # (after such a step apart)
        for kind, ours, theirs in (("gradient", got[1], cpu[1]), ("parameter", got[2], cpu[2])):
            for i, (a, b) in enumerate(zip(ours, theirs)):
                err = ((a - b).abs().max() / b.abs().max()).item()
                assert err <= 2.0 ** -4, f"step {step} {kind} {i}: {err:.3g} of its largest value"
    if compiled:
        assert not torch_pjrt.metrics()["compiled"]["Sequential.forward"]["eager_graphs"]


@pytest.mark.parametrize("config", ["int8-dynamic-activation", "int8-weight-only"])
def test_torchao_int8_inference_equals_cpu(dev: torch.device, config: str) -> None:
    # torchao's int8 configs (torch._int_mm with per-row scales, or int8 weights dequantized
    # on the fly) against the CPU, with no CPU fallback. Weight-only: a float32 dot in
    # another order (K = 128 terms: within 1e-5 of the output's scale). Dynamic activations:
    # the integer products are exact, but a float32 rounding apart in the first layer may move
    # a second-layer activation across an int8 rounding boundary: one int8 step (2^-7 of the
    # scale). A wrong scale, transpose or cast is off by the size of the output.
    import torch_pjrt
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    make = Int8DynamicActivationInt8WeightConfig if config == "int8-dynamic-activation" else Int8WeightOnlyConfig
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    outputs = []
    for device in ("cpu", dev):
        model = copy.deepcopy(base).to(device)
        quantize_(model, make())
        with torch.no_grad(), torch_pjrt.fallback_mode("error"):
            outputs.append(model(x.to(device)).cpu())
    scale = outputs[0].abs().max().item()
    atol = scale * (2.0 ** -7 if config == "int8-dynamic-activation" else 1e-5)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=atol)
    float_out = base(x).detach()
    assert (outputs[0] - float_out).abs().max() < 0.05 * float_out.abs().max()  # it did quantize, not much
    assert not torch.equal(outputs[0], float_out)


@pytest.mark.parametrize("granularity", ["tensorwise", "rowwise"])
def test_torchao_float8_dynamic_activation_inference_equals_cpu(dev: torch.device, granularity: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Float8DynamicActivationFloat8WeightConfig: float8 weights, activations cast to float8 per
    # call, torch._scaled_mm with tensorwise or rowwise scales. torchao's hardware check
    # refuses this CPU (it knows recent CUDA, MI300+ and XPU), and the torchao patch lets a
    # pjrt model through; the CPU reference skips the check here, in the test alone. float8
    # products are exact and both sum them in float32, but a rounding apart in the first
    # layer's bfloat16 output can move the second layer's activations (its dynamic scale too)
    # by a float8 step each, 2^-3 of their size: the bound is 2^-3 of the second layer's
    # term magnitudes (from the float64 model, a quarter more for its own quantization) plus
    # an output rounding; a wrong scale, transpose or cast is off by the size of the output.
    import torch_pjrt
    import torchao.quantization.quant_api as quant_api
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, PerTensor, quantize_
    from torchao.quantization.quantize_.workflows import Float8Tensor

    config = Float8DynamicActivationFloat8WeightConfig(granularity=PerTensor() if granularity == "tensorwise"
                                                       else PerRow())
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).bfloat16()
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    with pytest.raises(AssertionError, match="Float8 dynamic quantization requires"):
        quantize_(copy.deepcopy(base), config)  # CPU weights: torchao's own check still decides
    assert "torchao.float8_inference_hardware" in torch_pjrt.integrations.applied()
    model = copy.deepcopy(base).to(dev)
    quantize_(model, config)
    assert all(isinstance(m.weight, Float8Tensor) for m in model if isinstance(m, torch.nn.Linear))
    with torch.no_grad(), torch_pjrt.fallback_mode("error"):
        got = model(x.to(dev)).cpu().float()
    reference = copy.deepcopy(base)
    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    quantize_(reference, config)
    with torch.no_grad():
        want = reference(x).float()
    exact = copy.deepcopy(base).double()
    hidden = torch.relu(x.double() @ exact[0].weight.detach().t() + exact[0].bias.detach())
    magnitude = (hidden @ exact[2].weight.detach().abs().t() + exact[2].bias.detach().abs()).float()
    bound = 1.25 * 2.0 ** -3 * magnitude + 2.0 ** -7 * want.abs()
    assert bool(((got - want).abs() <= bound).all()), (got - want).abs().max()
    float_out = base(x).detach().float()
    assert (want - float_out).abs().max() < 0.1 * float_out.abs().max()  # it did quantize, not much
    assert not torch.equal(want, float_out)


@pytest.mark.parametrize("packing", ["default", "plain_int32"])
@pytest.mark.parametrize("compiled", [False, True])
def test_torchao_int4_weight_only_matches_its_own_quantization(dev: torch.device, packing: str,
                                                               compiled: bool) -> None:
    # Int4WeightOnlyConfig on pjrt (the torchao patches: plain_int32, the format torchao gives
    # XPU and NPU; the default "plain" one needs CUDA's kernels). The weights' 4-bit values,
    # scales and zero points equal torchao's own choose_qparams_affine/quantize_affine on the
    # CPU, bit for bit; the outputs equal the float64 product of torchao's dequantized weights
    # within two bfloat16 roundings (the hidden layer's and the output's, 2^-8 of the terms'
    # magnitudes each), eager and compiled, with no CPU fallback.
    import torch_pjrt
    from torchao.quantization import Int4WeightOnlyConfig, quantize_
    from torchao.quantization.quant_primitives import (MappingType, choose_qparams_affine, dequantize_affine,
                                                       quantize_affine)
    from torchao.quantization.quantize_.workflows import Int4PlainInt32Tensor

    group = 32
    config = Int4WeightOnlyConfig(group_size=group) if packing == "default" else \
        Int4WeightOnlyConfig(group_size=group, int4_packing_format="plain_int32")
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).bfloat16()
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    model = copy.deepcopy(base).to(dev)
    quantize_(model, config)
    layers = [m for m in model if isinstance(m, torch.nn.Linear)]
    assert all(isinstance(m.weight, Int4PlainInt32Tensor) for m in layers)

    def quantized(w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        block = [1, group]
        scale, zero = choose_qparams_affine(w, MappingType.ASYMMETRIC, block, torch.int32, 0, 15, 1e-6, None,
                                            torch.int32)
        q = quantize_affine(w, block, scale, zero, torch.int32, 0, 15)
        return q, scale, zero, dequantize_affine(q, block, scale, zero, torch.int32, 0, 15, output_dtype=w.dtype)

    dequantized = []
    for original, layer in zip([m for m in base if isinstance(m, torch.nn.Linear)], layers):
        q, scale, zero, w = quantized(original.weight.data)
        packed = layer.weight.qdata.cpu()
        assert packed.dtype == torch.uint8 and packed.shape == (q.shape[0], q.shape[1] // 2)  # 4 bits a value
        assert torch.equal(torch.stack([packed & 15, packed >> 4], -1).reshape(q.shape).to(torch.int32), q)
        assert torch.equal(layer.weight.scale.cpu().t().reshape(scale.shape), scale)
        assert torch.equal(layer.weight.zero_point.cpu().t().reshape(zero.shape).to(torch.int32), zero)
        dequantized.append(w.double())
    run = torch.compile(model, backend="pjrt") if compiled else model
    with torch.no_grad(), torch_pjrt.fallback_mode("error"):
        got = run(x.to(dev)).cpu().double()
    b1, b2 = base[0].bias.double(), base[2].bias.double()
    hidden = torch.relu(x.double() @ dequantized[0].t() + b1)
    want = hidden @ dequantized[1].t() + b2
    magnitude = (x.double().abs() @ dequantized[0].abs().t() + b1.abs()) @ dequantized[1].abs().t() + b2.abs()
    bound = 2 * 2.0 ** -8 * (magnitude + want.abs())
    assert bool(((got - want).abs() <= bound).all()), (got - want).abs().max()
    assert (want - base(x).double()).abs().max() > 1e-3  # it did quantize
    if compiled:
        assert not torch_pjrt.metrics()["compiled"]["Sequential.forward"]["eager_graphs"]


def test_torchao_int4_weight_only_applies_the_activation_pre_scale(dev: torch.device) -> None:
    # AWQ and SmoothQuant put a per-channel activation scale on the int4 weight
    # (act_pre_scale), which the linear applies to its input first: against the float64
    # product of torchao's dequantized weight with the scaled input (two bfloat16 roundings:
    # the scaled input's and the output's).
    from torchao.quantization import Int4WeightOnlyConfig, quantize_
    from torchao.quantization.quant_primitives import (MappingType, choose_qparams_affine, dequantize_affine,
                                                       quantize_affine)

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 16, bias=False).bfloat16()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    pre_scale = (torch.rand(64, generator=torch.Generator().manual_seed(2)) + 0.5).bfloat16()
    block = [1, 32]
    scale, zero = choose_qparams_affine(layer.weight.data, MappingType.ASYMMETRIC, block, torch.int32, 0, 15, 1e-6,
                                        None, torch.int32)
    q = quantize_affine(layer.weight.data, block, scale, zero, torch.int32, 0, 15)
    w = dequantize_affine(q, block, scale, zero, torch.int32, 0, 15, output_dtype=torch.bfloat16).double()
    model = copy.deepcopy(layer).to(dev)
    quantize_(model, Int4WeightOnlyConfig(group_size=32))
    model.weight.act_pre_scale = pre_scale.to(dev)
    with torch.no_grad():
        got = model(x.to(dev)).cpu().double()
    scaled = x.double() * pre_scale.double()
    want = scaled @ w.t()
    bound = 2 * 2.0 ** -8 * (scaled.abs() @ w.abs().t())
    assert bool(((got - want).abs() <= bound).all()), (got - want).abs().max()
    assert (want - x.double() @ w.t()).abs().max() > 10 * bound.max()  # the scale matters here
