"""Views and in-place semantics: every idiom behaves as on CPU, aliases included.

Each test runs the same program on a CPU tensor and on a pjrt tensor and
compares the base and a second view afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch_pjrt
from conftest import assert_close


def same_program(program: Callable[[torch.Tensor], list[torch.Tensor]], base: torch.Tensor,
                 layouts: bool = True) -> None:
    """Compares values; with `layouts`, also view metadata (sizes, strides, offset)."""
    cpu_out = program(base.clone())
    dev_out = program(base.clone().to("pjrt"))
    assert len(cpu_out) == len(dev_out)
    for d, c in zip(dev_out, cpu_out):
        assert d.shape == c.shape
        if layouts:
            assert d.stride() == c.stride() and d.storage_offset() == c.storage_offset()
        assert_close(d, c)


BASE = torch.arange(24, dtype=torch.float32).reshape(4, 6)

# (name, make the view, the in-place write through it)
VIEW_WRITES = [
    ("view", lambda b: b.view(6, 4), lambda v: v.mul_(2)),
    ("reshape", lambda b: b.reshape(2, 12), lambda v: v.add_(1)),
    ("transpose", lambda b: b.transpose(0, 1), lambda v: v[1].fill_(-1)),
    ("t", lambda b: b.t(), lambda v: v.sub_(torch.arange(4.0, device=v.device))),
    ("permute", lambda b: b.view(2, 2, 6).permute(2, 0, 1), lambda v: v.mul_(-1)),
    ("slice", lambda b: b[1:3, ::2], lambda v: v.zero_()),
    ("slice_step", lambda b: b[:, 1::3], lambda v: v.add_(100)),
    ("select", lambda b: b[2], lambda v: v.copy_(torch.ones(6, device=v.device))),
    ("select_col", lambda b: b[:, 3], lambda v: v.fill_(7)),
    ("narrow", lambda b: b.narrow(1, 2, 3), lambda v: v.mul_(0.5)),
    ("as_strided", lambda b: b.as_strided((3, 2), (5, 2), 1), lambda v: v.add_(1000)),
    ("diagonal", lambda b: b.diagonal(), lambda v: v.fill_(-5)),
    ("diagonal_offset", lambda b: b.diagonal(offset=2), lambda v: v.mul_(3)),
    ("unfold", lambda b: b.view(-1).unfold(0, 4, 4), lambda v: v[:, 0].fill_(9)),
    ("squeeze_unsqueeze", lambda b: b.unsqueeze(0)[0, 1:2].squeeze(0), lambda v: v.neg_()),
    ("flatten_chain", lambda b: b.t()[1:5].t()[::2], lambda v: v.add_(0.25)),
    ("view_dtype", lambda b: b.view(torch.int32), lambda v: v.bitwise_xor_(1)),
    ("view_dtype_narrower", lambda b: b.view(torch.int16), lambda v: v[:, 1::2].add_(3)),
    ("view_dtype_wider", lambda b: b.view(-1)[4:20].view(torch.float64), lambda v: v.mul_(2)),
    ("expand_read", lambda b: b[0:1].expand(3, 6), lambda v: v.sum().reshape(1)),
]


@pytest.mark.parametrize("name,make_view,write", VIEW_WRITES, ids=[v[0] for v in VIEW_WRITES])
def test_write_through_view_seen_by_base_and_other_views(name, make_view, write):
    def program(base: torch.Tensor) -> list[torch.Tensor]:
        view = make_view(base)
        other = base.t()[:, 1:]  # a second, overlapping view
        before = other.clone()
        write(view)
        return [base, view, other, before]

    same_program(program, BASE)


def test_reading_views_matches_cpu():
    def program(b: torch.Tensor) -> list[torch.Tensor]:
        return [x.contiguous() * 1 for x in (b.t(), b[1:, 2:5], b[::2, ::3], b.diagonal(), b.view(-1)[3:17:4],
                                             b.as_strided((2, 2), (1, 6), 2), b[0:1].expand(5, 6), b.flip(0),
                                             b.roll(1, 1), b.unfold(1, 2, 1))]

    same_program(program, BASE)


def test_out_variants_into_views():
    def program(b: torch.Tensor) -> list[torch.Tensor]:
        torch.add(b[0], b[1], out=b[3])
        torch.mul(b[:, 0], 2, out=b[:, 5])
        out = torch.empty(0, device=b.device)
        torch.sum(b, 0, out=out)  # resized by out=
        return [b, out]

    same_program(program, BASE)


def test_mask_and_index_assignment():
    def program(b: torch.Tensor) -> list[torch.Tensor]:
        v = b[1:]
        v[v > 10] = 0
        idx = torch.tensor([0, 2, 2], device=b.device)
        b[idx] += 1  # duplicate index: one add, as on CPU
        b.index_put_((torch.tensor([1, 1], device=b.device),), torch.tensor(5.0, device=b.device), accumulate=True)
        b[:, torch.tensor([5, 0], device=b.device)] = -1
        return [b, v]

    same_program(program, BASE)


def test_resize_and_set():
    def program(b: torch.Tensor) -> list[torch.Tensor]:
        r = b.clone()
        r.resize_(2, 3)
        s = b.clone()
        s.resize_(50)  # grows the storage: the old contents stay in front
        prefix = s[:24].clone()
        t = torch.empty(0, device=b.device)
        t.set_(b.untyped_storage(), 2, (2, 2), (6, 1))
        t.add_(1000)  # writes through to b
        return [r, prefix, t, b]

    same_program(program, BASE)


def test_zero_size_and_scalars(dev):
    z = torch.empty(0, 3, device=dev)
    assert (z + 1).shape == (0, 3)
    assert z.sum().item() == 0
    s = torch.tensor(3.0, device=dev)
    s.add_(2)
    assert s.item() == 5.0 and s.dim() == 0
    v = torch.arange(6.0, device=dev)[2:2]
    v.fill_(1)
    assert v.numel() == 0


def test_non_contiguous_inputs_to_ops():
    def program(b: torch.Tensor) -> list[torch.Tensor]:
        x = b.t()
        return [x @ b, torch.exp(x / 10), x.sum(1), torch.cat([x, x[:, :2]], 1), x.softmax(0)]

    # Op results are always dense row-major here (CPU may propagate the input's layout).
    same_program(program, BASE, layouts=False)


def test_version_counter_and_data_ptr_overlap(dev):
    b = torch.zeros(10, device=dev)
    v = b[2:5]
    version = b._version
    v.add_(1)
    assert b._version > version
    # Writes where several elements share one memory location are refused, as on CPU.
    with pytest.raises(RuntimeError, match="unsupported operation"):
        b[0:1].expand(4).add_(1)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        torch.add(b[1:5], 1, out=b[0:1].expand(4))
    assert b.cpu().tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0, 0]


def test_autograd_through_views():
    def run(device: str) -> list[torch.Tensor]:
        w = BASE.clone().to(device).requires_grad_()
        y = w.t()[1:4] * 2
        z = y.unsqueeze(0).expand(2, 3, 4).sum() + w.diagonal().pow(2).sum() + w[:, ::2].view(-1)[3:].sum()
        z.backward()
        c = BASE.clone().to(device).requires_grad_()
        d = c * 1
        d[1:3, 2:] *= 3  # in-place on a view of a non-leaf
        d.sum().backward()
        return [w.grad, c.grad]

    for d, c in zip(run("pjrt"), run("cpu")):
        assert_close(d, c)


def test_sliced_window_views_read_and_write_like_cpu(dev):
    """Views that are a slice of a reshaped window of their storage (split and
    narrow of inner dims, every other row, a column block) read with a
    pad + slice and write back into the window; all must match CPU."""
    base = torch.arange(2 * 6 * 12, dtype=torch.float32).reshape(2, 6, 12)
    d = base.to(dev)
    for t in (base, d):
        q, k, v = t.split(4, dim=2)         # qkv split: last-dim slices at offsets 0, 4, 8
        s = q * 2 + k - v.flip(0)
        rows = t[:, ::2, 3:9]               # strided rows, inner block
        t[:, 1::2, 8:].mul_(-1)             # write into a window that ends at the storage's end
        v.add_(100)                         # write into the last split
        t.narrow(2, 1, 2).copy_(s[..., :2]) # write from a computed value
        out = torch.cat([s.sum(-1), rows.reshape(2, -1)], 1)
        if t is base:
            expected = (t.clone(), out)
        else:
            got = (t.cpu(), out.cpu())
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])


def test_element_by_element_reads_match_cpu_and_download_the_buffer_once(dev):
    # Reading a tensor element by element (`for x in t`, `all(t)`) downloads the buffer whole
    # once the reads cost as much; the values must follow views, neg/conj bits and new contents.
    base_cpu = torch.randn(512, 1024, dtype=torch.float64)  # 4 MiB
    base = base_cpu.to(dev)
    cases = [lambda b: b.t()[::97, 3], lambda b: b[5, 1::41],
             lambda b: torch._neg_view(b[7::13, 11]), lambda b: b.view(-1)[123::40_000]]
    reads_before = torch_pjrt.metrics()["device_to_host_bytes"]
    for make in cases:
        assert [v.item() for v in make(base)] == [v.item() for v in make(base_cpu)]
    downloaded = torch_pjrt.metrics()["device_to_host_bytes"] - reads_before
    assert base_cpu.nbytes <= downloaded < 2 * base_cpu.nbytes, downloaded  # whole, once: not per element
    base.mul_(-3)  # new contents: new buffer
    base_cpu.mul_(-3)
    assert [v.item() for v in base[:, 9][::7]] == [v.item() for v in base_cpu[:, 9][::7]]
    z_cpu = torch.randn(300, 300, dtype=torch.complex64)
    z = z_cpu.to(dev)
    assert [v.item() for v in z.conj()[3][::17]] == [v.item() for v in z_cpu.conj()[3][::17]]
    y = torch.linspace(0, 99_999, 100_000, device=dev, dtype=torch.int32)
    assert all(y[:-1] < y[1:]) and not any(y[:-1] > y[1:])
