"""One rank of a multi-process test (tests/python/test_distributed.py starts
the ranks; each runs `python dist_workers.py SCENARIO OUT_DIR` with the env://
variables torchrun sets). A scenario checks pjrt against the same computation
on CPU in the same process and raises on any difference; the rank writes
OUT_DIR/rank<N>.json with what it measured or the error."""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt  # noqa: F401  (registers the device and the "pjrt" backend)

CPU_RNG = threading.Lock()  # seeding and drawing from the CPU generator (one per process) as one step


def dev() -> torch.device:
    """This rank's device ("pjrt", or the name TORCH_PJRT_DEVICE_NAME gives): its process's
    current one, or with ranks as threads (torch_pjrt.distributed.spawn) its thread's."""
    return torch.device(torch_pjrt.DEVICE_NAME, getattr(torch, torch_pjrt.DEVICE_NAME).current_device())
SCENARIOS: dict[str, Callable[[int, int], dict[str, Any]]] = {}


def scenario(fn: Callable[[int, int], dict[str, Any]]) -> Callable[[int, int], dict[str, Any]]:
    SCENARIOS[fn.__name__] = fn
    return fn


def timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=float(os.environ.get("DIST_TEST_TIMEOUT", "60")))


def exact(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """pjrt's result against CPU gloo's: the same bytes moved and reduced by the
    same gloo code, so they must be equal, bit for bit."""
    assert got.device.type == dev().type, f"{what}: result on {got.device}"
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


def values(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    hi = 4 if dtype == torch.uint8 else 7  # small: products stay in range
    return torch.randint(1, hi, shape, generator=g).to(dtype)


# ---------------------------------------------------------------- collectives
@scenario
def collectives(rank: int, world: int) -> dict[str, Any]:
    """Each collective on pjrt tensors against the same collective on CPU
    tensors over gloo, in one mixed "cpu:gloo,pjrt:pjrt" group."""
    dist.init_process_group("cpu:gloo,pjrt:pjrt", timeout=timeout())
    checked: list[str] = []

    def both(name: str, shape: tuple[int, ...], dtype: torch.dtype, run: Callable[[torch.Tensor], Any],
             seed: int = 0, result_on: int | None = None) -> None:
        x = values(shape, dtype, 100 * seed + rank)
        want = x.clone()
        run(want)
        got = x.to(dev())
        run(got)
        if result_on is None or rank == result_on:  # reduce: other ranks' buffers are unspecified
            exact(got, want, f"{name} {dtype}")
        checked.append(f"{name}/{dtype}")

    R = dist.ReduceOp
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                  torch.int8, torch.uint8):
        for op in (R.SUM, R.PRODUCT, R.MIN, R.MAX):
            both(f"all_reduce {op}", (5, 3), dtype, lambda t, op=op: dist.all_reduce(t, op=op))
        both("broadcast", (4,), dtype, lambda t: dist.broadcast(t, src=1))
        both("reduce", (6,), dtype, lambda t: dist.reduce(t, dst=1, op=R.MAX), result_on=1)
    for dtype in (torch.int64, torch.int32, torch.uint8, torch.bool):
        for op in (R.BAND, R.BOR, R.BXOR):
            if dtype == torch.bool and op == R.BXOR:
                continue  # gloo has no bool xor
            both(f"all_reduce {op}", (7,), dtype, lambda t, op=op: dist.all_reduce(t, op=op))

    # AVG and PREMUL_SUM: gloo has neither; the CPU reference is SUM then scale.
    for dtype in (torch.float32, torch.bfloat16):
        x = values((3, 4), dtype, rank)
        got = x.to(dev())
        dist.all_reduce(got, op=R.AVG)
        want = x.clone()
        dist.all_reduce(want)
        exact(got, want / world, f"all_reduce AVG {dtype}")
        got = x.to(dev())
        dist.all_reduce(got, op=dist._make_nccl_premul_sum(0.5))
        want = x * 0.5
        dist.all_reduce(want)
        exact(got, want, f"all_reduce PREMUL_SUM {dtype}")
    checked.append("avg/premul_sum")

    # all_gather: list and into one tensor (concatenated and stacked shapes).
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        x = values((2, 3), dtype, rank)
        outs = [torch.empty_like(x, device=dev()) for _ in range(world)]
        dist.all_gather(outs, x.to(dev()))
        ref = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(ref, x)
        for o, r in zip(outs, ref):
            exact(o, r, f"all_gather {dtype}")
        for out_shape in ((2 * world, 3), (world, 2, 3)):
            out = torch.empty(out_shape, dtype=dtype, device=dev())
            dist.all_gather_into_tensor(out, x.to(dev()))
            exact(out, torch.cat(ref).reshape(out_shape), f"all_gather_into_tensor {out_shape} {dtype}")
    checked.append("all_gather")

    # reduce_scatter: list and tensor forms, SUM and AVG.
    for dtype in (torch.float32, torch.int64):
        chunks = [values((3,), dtype, 10 * rank + j) for j in range(world)]
        full = [c.clone() for c in chunks]
        dist.all_reduce(torch.cat(full))  # warm the group; result not used
        reduced = torch.cat(chunks).clone()
        dist.all_reduce(reduced)
        want = reduced.view(world, 3)[rank]
        out = torch.empty(3, dtype=dtype, device=dev())
        dist.reduce_scatter(out, [c.to(dev()) for c in chunks])
        exact(out, want, f"reduce_scatter {dtype}")
        out = torch.empty(3, dtype=dtype, device=dev())
        dist.reduce_scatter_tensor(out, torch.cat(chunks).to(dev()))
        exact(out, want, f"reduce_scatter_tensor {dtype}")
        if dtype.is_floating_point:
            dist.reduce_scatter_tensor(out, torch.cat(chunks).to(dev()), op=R.AVG)
            exact(out, want / world, "reduce_scatter_tensor AVG")
    checked.append("reduce_scatter")

    # all_to_all_single: equal splits and split sizes that differ by rank.
    x = values((4 * world, 2), torch.float32, rank)
    got = torch.empty_like(x, device=dev())
    dist.all_to_all_single(got, x.to(dev()))
    want = torch.empty_like(x)
    dist.all_to_all_single(want, x)
    exact(got, want, "all_to_all_single")
    in_splits = [1, 3] if rank == 0 else [2, 2]
    out_splits = [1, 2] if rank == 0 else [3, 2]
    x = values((4, 2), torch.float32, rank)
    got = torch.empty(sum(out_splits), 2, device=dev())
    dist.all_to_all_single(got, x.to(dev()), out_splits, in_splits)
    want = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(want, x, out_splits, in_splits)
    exact(got, want, "all_to_all_single with split sizes")
    ins = [values((2, 2), torch.int64, rank * 7 + j) for j in range(world)]
    outs = [torch.empty((2, 2), dtype=torch.int64, device=dev()) for _ in range(world)]
    dist.all_to_all(outs, [t.to(dev()) for t in ins])
    ref = [torch.empty((2, 2), dtype=torch.int64) for _ in range(world)]
    dist.all_to_all(ref, ins)
    for o, r in zip(outs, ref):
        exact(o, r, "all_to_all")
    checked.append("all_to_all")

    # gather and scatter, root 1 and root 0.
    x = values((3,), torch.float32, rank)
    got = [torch.empty(3, device=dev()) for _ in range(world)] if rank == 1 else None
    dist.gather(x.to(dev()), got, dst=1)
    want = [torch.empty(3) for _ in range(world)] if rank == 1 else None
    dist.gather(x, want, dst=1)
    if rank == 1:
        for o, r in zip(got, want):
            exact(o, r, "gather")
    parts = [values((2, 2), torch.float32, 50 + j) for j in range(world)]
    got = torch.empty(2, 2, device=dev())
    dist.scatter(got, [p.to(dev()) for p in parts] if rank == 0 else None, src=0)
    exact(got, parts[rank], "scatter")
    checked.append("gather/scatter")

    # In-place results reach every view of the storage; non-contiguous views work.
    base = torch.zeros(4, 6, device=dev())
    flat_view = base.view(-1)
    window = base[:, 1:4]
    dist.all_reduce(window.copy_(torch.full((4, 3), float(rank + 1), device=dev())))
    expected = torch.zeros(4, 6)
    expected[:, 1:4] = sum(range(1, world + 1))
    exact(base, expected, "all_reduce into a view: the base")
    exact(flat_view, expected.view(-1), "all_reduce into a view: another view")
    checked.append("views")

    # async_op: a Work to wait on and a future holding the outputs.
    x = values((5,), torch.float32, rank)
    got = x.to(dev())
    work = dist.all_reduce(got, async_op=True)
    work.wait()
    result = work.get_future().wait()
    want = x.clone()
    dist.all_reduce(want)
    exact(result[0], want, "async all_reduce future value")
    exact(got, want, "async all_reduce")
    checked.append("async")

    # Coalesced all_reduce and the functional collectives DTensor uses.
    import torch.distributed._functional_collectives as funcol
    a, b = values((3,), torch.float32, rank), values((2, 2), torch.float32, rank + 9)
    ga, gb = a.to(dev()), b.to(dev())
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(ga)
        dist.all_reduce(gb)
    cm.wait()
    ra, rb = a.clone(), b.clone()
    dist.all_reduce(ra)
    dist.all_reduce(rb)
    exact(ga, ra, "coalesced all_reduce (a)")
    exact(gb, rb, "coalesced all_reduce (b)")
    # Coalesced all_gather_into_tensor / reduce_scatter_tensor (FSDP-style).
    outs = [torch.empty(world * 3, device=dev()), torch.empty(world * 4, device=dev())]
    with dist._coalescing_manager(device=dev(), async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], a.to(dev()))
        dist.all_gather_into_tensor(outs[1], b.view(-1).to(dev()))
    cm.wait()
    exact(outs[0], torch.cat(_gathered(a, world)), "coalesced all_gather_into_tensor (a)")
    exact(outs[1], torch.cat(_gathered(b.view(-1), world)), "coalesced all_gather_into_tensor (b)")
    group = dist.group.WORLD
    exact(funcol.all_reduce(a.to(dev()), "sum", group), ra, "funcol all_reduce")
    exact(funcol.all_gather_tensor(a.to(dev()), 0, group), torch.cat(_gathered(a, world)), "funcol all_gather_tensor")
    rs_in = values((2 * world,), torch.float32, rank)
    rs_ref = rs_in.clone()
    dist.all_reduce(rs_ref)
    exact(funcol.reduce_scatter_tensor(rs_in.to(dev()), "sum", 0, group), rs_ref.view(world, 2)[rank],
          "funcol reduce_scatter_tensor")
    exact(funcol.all_to_all_single(rs_in.to(dev()), None, None, group),
          _all_to_all_cpu(rs_in, world), "funcol all_to_all_single")
    checked.append("coalesced/functional")

    # Point to point: send/recv, isend/irecv both ways (each rank waits on its
    # send first), recv from any source, batch_isend_irecv around the ring.
    peer = 1 - rank
    x = values((3, 2), torch.float32, rank)
    got = torch.empty(3, 2, device=dev())
    if rank == 0:
        dist.send(x.to(dev()), dst=1)
    else:
        dist.recv(got, src=0)
        exact(got, values((3, 2), torch.float32, 0), "send/recv")
    send = dist.isend(x.to(dev()), dst=peer, tag=3)
    recv = dist.irecv(got, src=peer, tag=3)
    send.wait()
    recv.wait()
    exact(got, values((3, 2), torch.float32, peer), "isend/irecv")
    if rank == 0:
        dist.send(x.to(dev()), dst=1, tag=5)
    else:
        source = dist.recv(got, tag=5)
        assert source == 0, source
        exact(got, values((3, 2), torch.float32, 0), "recv from any source")
    ops = [dist.P2POp(dist.isend, x.to(dev()), (rank + 1) % world),
           dist.P2POp(dist.irecv, got, (rank - 1) % world)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    exact(got, values((3, 2), torch.float32, (rank - 1) % world), "batch_isend_irecv")
    checked.append("p2p")

    # A pjrt-only subgroup: object collectives and barrier run on pjrt tensors.
    pjrt_group = dist.new_group(backend="pjrt")
    objects: list[Any] = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"}, group=pjrt_group)
    assert objects == [{"rank": r, "name": f"r{r}"} for r in range(world)], objects
    box = [{"from": rank}] if rank == 0 else [None]
    dist.broadcast_object_list(box, src=0, group=pjrt_group)
    assert box == [{"from": 0}], box
    dist.barrier(group=pjrt_group)
    y = values((4,), torch.float32, rank)
    got = y.to(dev())
    dist.all_reduce(got, group=pjrt_group)
    want = y.clone()
    dist.all_reduce(want)
    exact(got, want, "pjrt-only group all_reduce")
    checked.append("pjrt group/objects")
    solo = dist.new_group([1], backend="pjrt")  # every rank takes part in creating it
    if rank == 1:
        assert dist.get_rank(solo) == 0 and dist.get_world_size(solo) == 1
        t = torch.full((2,), 5.0, device=dev())
        dist.all_reduce(t, group=solo)
        dist.broadcast(t, group_src=0, group=solo)
        exact(t, torch.full((2,), 5.0), "a one-rank subgroup")
    checked.append("subgroup")

    # A collective inside a compiled graph: with ranks as threads (the XLA transport) it
    # is inside the graph's program; across processes (host-staged) the graph runs
    # eagerly, a collective being a host transfer. The right result either way.
    fn = torch.compile(lambda t: funcol.all_reduce(t * 2, "sum", group) + 1, backend="pjrt")
    exact(fn(a.to(dev())), ra * 2 + 1, "compiled graph with a collective")
    exact(fn(a.to(dev())), ra * 2 + 1, "compiled graph with a collective, second call")
    eager_reasons = [why for stats in torch_pjrt.metrics()["compiled"].values() for why in stats["eager_graphs"]]
    checked.append("compiled")

    dist.barrier()
    dist.destroy_process_group()
    return {"checked": checked, "compiled_eager_reasons": eager_reasons,
            "processes": torch_pjrt.metrics()["distributed"]["processes"]}


def _gathered(x: torch.Tensor, world: int) -> list[torch.Tensor]:
    out = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(out, x)
    return out


def _all_to_all_cpu(x: torch.Tensor, world: int) -> torch.Tensor:
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out


# ---------------------------------------------------------------- bad input, faults
def _raises(fn: Callable[[], Any], *needles: str) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the message is what is checked)
        msg = str(e)
        for n in needles:
            assert n in msg, f"expected {n!r} in the error, got: {msg}"
        return msg.splitlines()[0]
    raise AssertionError(f"no error; expected one mentioning {needles}")


@scenario
def bad_input(rank: int, world: int) -> dict[str, Any]:
    dist.init_process_group("pjrt", timeout=timeout())
    msgs = {}
    n = 4 if rank == 0 else 5
    msgs["shapes"] = _raises(lambda: dist.all_reduce(torch.ones(n, device=dev())), "all_reduce", "[4]", "[5]")
    dtype = torch.float32 if rank == 0 else torch.int64
    msgs["dtypes"] = _raises(lambda: dist.broadcast(torch.ones(3, dtype=dtype, device=dev()), src=0),
                             "broadcast", "Float", "Long")
    msgs["root"] = _raises(lambda: dist.broadcast(torch.ones(3, device=dev()), src=rank), "root")
    msgs["different ops"] = _raises(
        lambda: dist.all_reduce(torch.ones(3, device=dev())) if rank == 0 else dist.broadcast(
            torch.ones(3, device=dev()), src=0), "different collectives")
    msgs["bitwise on float"] = _raises(
        lambda: dist.all_reduce(torch.ones(3, device=dev()), op=dist.ReduceOp.BAND), "BAND", "integer")
    msgs["cpu tensor"] = _raises(lambda: dist.all_reduce(torch.ones(3)), "cpu")
    in_splits = [1, 1] if rank == 0 else [2, 2]
    msgs["splits"] = _raises(
        lambda: dist.all_to_all_single(torch.empty(2 if rank == 0 else 4, device=dev()),
                                       torch.ones(sum(in_splits), device=dev()), [1, 1] if rank == 0 else [2, 2],
                                       in_splits), "rows")
    msgs["row shape"] = _raises(
        lambda: dist.all_to_all_single(torch.empty(4, 3, device=dev()), torch.ones(4, 2, device=dev())),
        "all_to_all_single", "differ in shape")
    # recv into a buffer of the wrong size: an error, not gloo's abort.
    if rank == 0:
        dist.send(torch.ones(10, device=dev()), dst=1)
    else:
        msgs["recv size"] = _raises(lambda: dist.recv(torch.empty(5, device=dev()), src=0), "sent", "[10]", "[5]")
    # The group still works after all of that, with data intact.
    t = torch.full((3,), float(rank), device=dev())
    dist.all_reduce(t)
    exact(t, torch.full((3,), float(sum(range(world)))), "all_reduce after errors")
    # A receive nobody sends to does not hold up the group's destruction. (Posted before the
    # barrier: posted after it, a peer that had already left made the posting itself fail.)
    dist.irecv(torch.empty(2, device=dev()), src=1 - rank, tag=99)
    dist.barrier()
    start = time.monotonic()
    dist.destroy_process_group()
    return {"messages": msgs, "destroy_seconds": time.monotonic() - start}


@scenario
def recv_from_a_rank_that_left(rank: int, world: int) -> dict[str, Any]:
    """A receive from a rank whose process group is gone fails at once, not at the timeout."""
    dist.init_process_group("pjrt", timeout=timeout())
    dist.barrier()
    if rank == 1:
        dist.destroy_process_group()
        return {}
    start = time.monotonic()
    msg = _raises(lambda: dist.recv(torch.empty(2, device=dev()), src=1, tag=4), "rank 1 has left the group")
    seconds = time.monotonic() - start
    dist.destroy_process_group()
    return {"message": msg, "seconds": seconds}


@scenario
def peer_dies(rank: int, world: int) -> dict[str, Any]:
    dist.init_process_group("pjrt", timeout=timeout())
    dist.barrier()
    if rank == 1:
        os._exit(0)  # dies without a word
    start = time.monotonic()
    msg = _raises(lambda: dist.all_reduce(torch.ones(3, device=dev())), "pjrt all_reduce")
    return {"seconds": time.monotonic() - start, "message": msg}


@scenario
def peer_hangs(rank: int, world: int) -> dict[str, Any]:
    dist.init_process_group("pjrt", timeout=timeout())
    dist.barrier()
    if rank == 1:
        time.sleep(3600)  # alive, never answers (the test kills it)
    start = time.monotonic()
    msg = _raises(lambda: dist.all_reduce(torch.ones(3, device=dev())), "pjrt all_reduce")
    return {"seconds": time.monotonic() - start, "message": msg}


# ---------------------------------------------------------------- training
def _mlp(seed: int = 0) -> nn.Module:
    with CPU_RNG:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4))


def _batch(seed: int = 1, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)


STEPS = 4
LR = 0.05


def _reference_params(model_fn: Callable[[], nn.Module], steps: int, dtype: torch.dtype = torch.float64,
                      batch_fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]] = _batch) -> list[torch.Tensor]:
    """Single-process training on the full batch on CPU in float64: the oracle."""
    model = model_fn().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch_fn(step)
        opt.zero_grad()
        F.mse_loss(model(x.to(dtype)), y.to(dtype)).backward()
        opt.step()
    return [p.detach().float() for p in model.parameters()]


def _close_to_reference(got: list[torch.Tensor], want: list[torch.Tensor], rtol: float, what: str) -> float:
    worst = 0.0
    for g, w in zip(got, want):
        err = ((g.float() - w).abs().max() / w.abs().max().clamp_min(1e-3)).item()
        worst = max(worst, err)
    assert worst < rtol, f"{what}: parameters differ from the full-batch reference by {worst:.2e} (limit {rtol:.1e})"
    return worst


# float32 against a float64 reference over a few steps of a tiny model: the
# error is a few float32 ulps per op; 1e-4 relative leaves room for ~100.
F32_RTOL = 1e-4


def _local_batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _batch(step)
    n = x.shape[0] // world
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def _train_ddp(rank: int, world: int, **ddp_options: Any) -> list[torch.Tensor]:
    """STEPS of SGD on the MLP under DDP (device_ids as CUDA scripts pass them); the parameters after."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(_mlp().to(dev()), device_ids=[dev().index], **ddp_options)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _local_batch(step, rank, world)
        opt.zero_grad()
        F.mse_loss(model(x.to(dev())), y.to(dev())).backward()
        opt.step()
    return [p.detach().cpu() for p in model.module.parameters()]


@scenario
def ddp(rank: int, world: int) -> dict[str, Any]:
    dist.init_process_group("pjrt", timeout=timeout())
    backend = dist.group.WORLD._get_backend(dev())
    assert type(backend).__name__ == "_ProcessGroupPjrt", type(backend)
    # device_ids as CUDA scripts pass them (DDP then uses streams and record_stream).
    got = _train_ddp(rank, world, bucket_cap_mb=0.001)  # several buckets
    err = _close_to_reference(got, _reference_params(_mlp, STEPS), F32_RTOL, "DDP")
    gathered = [torch.empty_like(got[0], device=dev()) for _ in range(world)]
    dist.all_gather(gathered, got[0].to(dev()))
    exact(gathered[0], gathered[1].cpu(), "DDP ranks hold the same parameters")
    dist.destroy_process_group()
    return {"max_rel_error": err, "mode": torch_pjrt.eager_mode(), "transport": backend.transport}


@scenario
def renamed_device(rank: int, world: int) -> dict[str, Any]:
    """Run with TORCH_PJRT_DEVICE_NAME=tpu: no backend named, as scripts written
    for a "tpu" device do; then the alias those scripts' libraries use ("tpu_dist")."""
    assert dev().type == "tpu", dev()
    dist.init_process_group(timeout=timeout())
    backend = dist.group.WORLD._get_backend(dev())
    assert type(backend).__name__ == "_ProcessGroupPjrt", type(backend)
    got = _train_ddp(rank, world)
    err = _close_to_reference(got, _reference_params(_mlp, STEPS), F32_RTOL, "DDP on the renamed device")
    alias = dist.new_group(backend="tpu_dist")
    total = torch.full((3,), float(rank + 1), device=dev())
    dist.all_reduce(total, group=alias)
    exact(total, torch.full((3,), float(world * (world + 1) // 2)), "all_reduce over tpu_dist")
    dist.destroy_process_group()
    return {"max_rel_error": err}


def _hf_ddp_report(rank: int, world: int, got: list[dict[str, torch.Tensor]], what: str) -> dict[str, Any]:
    """The ranks' parameters after every step are identical, and those of rank 0 follow a
    single-process full-batch float64 run within 16x float32's own distance to it."""
    import hf_stack
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, [{n: t.float() for n, t in step.items()} for step in got])
    for other in gathered[1:]:
        for step, (a, b) in enumerate(zip(gathered[0], other)):
            for name in a:
                assert torch.equal(a[name], b[name]), f"{what}: ranks differ at step {step} in {name}"
    data = hf_stack.TokenDataset()
    steps = len(got)
    full = [torch.stack([data[world * 2 * s + i]["input_ids"] for i in range(world * 2)]) for s in range(steps)]
    ratio, where = hf_stack.worst_ratio(got, hf_stack.reference_trajectory(torch.float64, full, steps),
                                        hf_stack.reference_trajectory(torch.float32, full, steps))
    assert ratio < 1, f"{what}: {ratio:.2f}x the allowed distance from the full-batch float64 run at {where}"
    return {"worst_ratio": ratio, "steps": steps}


@scenario
def trainer_ddp(rank: int, world: int) -> dict[str, Any]:
    """An unmodified Trainer under torchrun: DDP over the pjrt process group, 2 sequences per rank."""
    import hf_stack
    import transformers
    from torch.nn.parallel import DistributedDataParallel as DDP
    recorder = hf_stack.StepRecorder()
    args = hf_stack.training_args(os.path.join(os.environ["DIST_TEST_OUT"], f"trainer{rank}"), 2, 3)
    trainer = transformers.Trainer(model=hf_stack.make_llama(), args=args, train_dataset=hf_stack.TokenDataset(),
                                   callbacks=[recorder])
    assert args.world_size == world and args.device == dev(), (args.world_size, args.device)
    trainer.train()
    assert isinstance(trainer.model_wrapped, DDP), type(trainer.model_wrapped)
    assert type(dist.group.WORLD._get_backend(dev())).__name__ == "_ProcessGroupPjrt"
    return _hf_ddp_report(rank, world, [s.params for s in recorder.states], "Trainer DDP")


@scenario
def accelerate_ddp(rank: int, world: int) -> dict[str, Any]:
    """A plain accelerate loop (Accelerator(), prepare, backward) under torchrun."""
    import hf_stack
    from accelerate import Accelerator
    from torch.nn.parallel import DistributedDataParallel as DDP
    accelerator = Accelerator()
    assert accelerator.device == dev() and accelerator.num_processes == world, (accelerator.device,
                                                                             accelerator.num_processes)
    model = hf_stack.make_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=hf_stack.LR, weight_decay=0.0)
    loader = torch.utils.data.DataLoader(hf_stack.TokenDataset(), batch_size=2, shuffle=False)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    assert isinstance(model, DDP), type(model)
    got = []
    for step, batch in enumerate(loader):
        if step == 3:
            break
        assert batch["input_ids"].device == dev()
        loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        got.append({n: p.detach().to("cpu", torch.float64) for n, p in model.module.named_parameters()})
    return _hf_ddp_report(rank, world, got, "accelerate DDP")


@scenario
def fsdp(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor
    dist.init_process_group("pjrt", timeout=timeout())
    results = {}
    for name, reshard, mp in [("reshard", True, None), ("no reshard", False, None),
                              ("bf16 params", True, MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                         reduce_dtype=torch.float32))]:
        model = _mlp().to(dev())
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, reshard_after_forward=reshard, mp_policy=mp or MixedPrecisionPolicy())
        fully_shard(model, reshard_after_forward=reshard, mp_policy=mp or MixedPrecisionPolicy())
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for step in range(STEPS):
            x, y = _local_batch(step, rank, world)
            opt.zero_grad()
            F.mse_loss(model(x.to(dev())).float(), y.to(dev())).backward()
            opt.step()
        got = [p.full_tensor().cpu() if isinstance(p, DTensor) else p.cpu() for p in model.parameters()]
        # bf16 forward and backward: bf16 keeps 8 bits, so a few steps stay within a few 2^-8.
        rtol = F32_RTOL if mp is None else 4 * 2 ** -8
        results[name] = _close_to_reference(got, _reference_params(_mlp, STEPS), rtol, f"FSDP2 {name}")
    dist.destroy_process_group()
    return {"max_rel_error": results}


class _Attention(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds some of them.
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (self.q(x), self.k(x), self.v(x)))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = _Attention()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.down(F.gelu(self.up(x)))


def _block(seed: int = 0) -> nn.Module:
    with CPU_RNG:
        torch.manual_seed(seed)
        return _Block()


def _seq_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 6, 16, generator=g), torch.randn(4, 6, 16, generator=g)


def _tensor_parallel_block(mesh: Any) -> nn.Module:
    """The block with its attention and MLP split over `mesh` (Megatron style)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    return parallelize_module(_block().to(dev()), mesh, {
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()})


def _train_block(model: nn.Module, rows: int = 1, row: int = 0) -> list[torch.Tensor]:
    """STEPS of SGD, each on part `row` of `rows` of the batch; the full parameters after."""
    from torch.distributed.tensor import DTensor
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _seq_batch(step)
        n = x.shape[0] // rows
        x, y = x[row * n:(row + 1) * n], y[row * n:(row + 1) * n]
        opt.zero_grad()
        F.mse_loss(model(x.to(dev())), y.to(dev())).backward()
        opt.step()
    return [p.full_tensor().cpu() if isinstance(p, DTensor) else p.detach().cpu() for p in model.parameters()]


@scenario
def tensor_parallel(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("pjrt", timeout=timeout())
    mesh = init_device_mesh("pjrt", (world,))
    got = _train_block(_tensor_parallel_block(mesh))  # the same full batch on every rank
    err = _close_to_reference(got, _reference_params(_block, STEPS, batch_fn=_seq_batch), F32_RTOL,
                              "tensor parallel block")
    # DTensor's RNG tracker reads and sets the pjrt generator state (16 bytes:
    # seed, offset): a replicated random tensor is the same on every rank.
    import torch.distributed.tensor as dt
    torch.manual_seed(1234)
    replicated = dt.rand(8, 4, device_mesh=mesh, placements=[dt.Replicate()]).to_local()
    copies = [torch.empty_like(replicated) for _ in range(world)]
    dist.all_gather(copies, replicated)
    for c in copies[1:]:
        exact(c, copies[0].cpu(), "replicated dt.rand is the same on every rank")
    sharded = dt.rand(8, 4, device_mesh=mesh, placements=[dt.Shard(0)]).full_tensor()
    assert sharded.shape == (8, 4) and not torch.equal(sharded[:4].cpu(), sharded[4:].cpu()), "shards repeat"
    from torch.distributed.tensor import _random
    tracker_device = str(_random._rng_tracker._device)  # each rank's own: its generator, not another's
    dist.destroy_process_group()
    return {"max_rel_error": err, "rng_tracker_device": tracker_device}


@scenario
def fsdp_tp(rank: int, world: int) -> dict[str, Any]:
    """A 2-D mesh: tensor parallelism within each row of 2 ranks, FSDP2 across the rows
    (each row trains on its part of the batch), against full-batch single-device training."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("pjrt", timeout=timeout(), device_id=dev())
    tp = 2
    mesh = init_device_mesh(dev().type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    model = _tensor_parallel_block(mesh["tp"])
    fully_shard(model, mesh=mesh["dp"])
    got = _train_block(model, rows=world // tp, row=mesh.get_local_rank("dp"))  # each row its part of the batch
    err = _close_to_reference(got, _reference_params(_block, STEPS, batch_fn=_seq_batch), F32_RTOL,
                              "FSDP2 x tensor parallel block")
    dist.destroy_process_group()
    return {"max_rel_error": err}


# ---------------------------------------------------------------- collectives inside compiled programs
def _compiled_report(what: str, programs: int) -> dict[str, Any]:
    """After every rank's last step: each compiled function of this process ran as programs
    only (no graph ran eagerly), `programs` of them, with collectives inside."""
    dist.barrier()  # every rank's counters are in
    stats = torch_pjrt.metrics()
    compiled = stats["compiled"]
    eager = [why for f in compiled.values() for why in f["eager_graphs"]]
    assert not eager, f"{what}: graphs ran eagerly: {eager}"
    made = sum(f["programs"] for f in compiled.values())
    assert made == programs, f"{what}: {made} programs, expected {programs}: {compiled}"
    assert stats["distributed"]["in_programs"] > 0, f"{what}: no collective ran inside a program"
    return {"programs": made, "in_programs": stats["distributed"]["in_programs"]}


def _step_oracle(model_fn: Callable[[], nn.Module], steps: int,
                 batch_fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> list[list[torch.Tensor]]:
    """The float64 full-batch parameters after each step (_reference_params, step by step)."""
    model = model_fn().double()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    after = []
    for step in range(steps):
        x, y = batch_fn(step)
        opt.zero_grad()
        F.mse_loss(model(x.double()), y.double()).backward()
        opt.step()
        after.append([p.detach().float() for p in model.parameters()])
    return after


def _full(p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    return (p.full_tensor() if isinstance(p, DTensor) else p.detach()).cpu()


def _train_compiled(model: nn.Module, model_fn: Callable[[], nn.Module],
                    batch_fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
                    local_batch_fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]], loss_divisor: int,
                    what: str) -> float:
    """STEPS of SGD on torch.compile(model), each on this rank's batch; each step's full
    parameters against full-batch float64 training of model_fn on batch_fn's batches. The
    worst relative error."""
    compiled = torch.compile(model, backend="pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    oracle = _step_oracle(model_fn, STEPS, batch_fn)
    worst = 0.0
    for step in range(STEPS):
        x, y = local_batch_fn(step)
        opt.zero_grad()
        (F.mse_loss(compiled(x.to(dev())), y.to(dev())) / loss_divisor).backward()
        opt.step()
        worst = max(worst, _close_to_reference([_full(p) for p in model.parameters()], oracle[step], F32_RTOL,
                                               f"{what}, step {step}"))
    return worst


@scenario
def compiled_collectives(rank: int, world: int) -> dict[str, Any]:
    """Every functional collective inside one torch.compile program (each rank's device its
    replica): three calls on new values each, every result against the CPU's."""
    import torch.distributed._functional_collectives as funcol
    dist.init_process_group("pjrt", timeout=timeout())
    group = dist.group.WORLD

    def step(x: torch.Tensor, flags: torch.Tensor) -> tuple[torch.Tensor, ...]:
        total = funcol.all_reduce(x * 2, "sum", group)
        mean = funcol.all_reduce(x, "avg", group)
        top = funcol.all_reduce(x.to(torch.int64), "max", group)
        anyone = funcol.all_reduce(flags, "sum", group)  # bool: gathered and reduced on the device
        gathered = funcol.all_gather_tensor(x + 1, 0, group)
        scattered = funcol.reduce_scatter_tensor(gathered * 3, "sum", 0, group)
        exchanged = funcol.all_to_all_single(gathered, None, None, group)
        root = funcol.broadcast(x - 1, 1, group)
        return total + 1, mean, top, anyone, gathered, scattered, exchanged, root

    compiled = torch.compile(step, backend="pjrt")
    calls = 3
    for call in range(calls):
        # Integer values in float32: every sum is exact in any order.
        xs = [values((world, 3), torch.int64, 100 * call + r).float() for r in range(world)]
        fs = [values((5,), torch.bool, 100 * call + r) for r in range(world)]
        got = compiled(xs[rank].to(dev()), fs[rank].to(dev()))
        gathered = torch.cat([x + 1 for x in xs])
        want = (sum(x * 2 for x in xs) + 1, sum(xs) / world, torch.stack(xs).to(torch.int64).amax(0),
                torch.stack(fs).any(0), gathered, (gathered * 3 * world).chunk(world)[rank],
                torch.cat([x.chunk(world)[rank] for x in [torch.cat([y + 1 for y in xs])] * world]), xs[1] - 1)
        names = ("sum", "avg", "max", "bool sum", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
        for name, g, w in zip(names, got, want):
            exact(g, w, f"compiled {name}, call {call}")
    return _compiled_report("compiled collectives", programs=world)


@scenario
def tensor_parallel_compiled(rank: int, world: int) -> dict[str, Any]:
    """The tensor-parallel block under torch.compile: DTensor's collectives (forward and
    backward) inside one forward and one backward program per rank; each step's parameters
    against full-batch float64 training."""
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("pjrt", timeout=timeout())
    mesh = init_device_mesh("pjrt", (world,))
    model = _tensor_parallel_block(mesh)
    worst = _train_compiled(model, _block, _seq_batch, _seq_batch, 1, "compiled tensor parallel")
    return {"max_rel_error": worst, **_compiled_report("compiled tensor parallel", programs=2 * world)}


@scenario
def simple_fsdp_compiled(rank: int, world: int) -> dict[str, Any]:
    """TorchTitan's SimpleFSDP (parameters as sharded DTensors gathered in the forward, their
    gradients reduce-scattered) under torch.compile: the all-gathers and reduce-scatters inside
    one forward and one backward program per rank; each step's parameters against full-batch
    float64 training (SimpleFSDP sums the ranks' gradients: each rank's loss is divided by the
    world size)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.experiments.graph_trainer.simple_fsdp import data_parallel
    dist.init_process_group("pjrt", timeout=timeout())
    mesh = init_device_mesh("pjrt", (world,))
    model = data_parallel(_mlp().to(dev()), mesh, mode="fully_shard")
    worst = _train_compiled(model, _mlp, _batch, lambda step: _local_batch(step, rank, world), world,
                            "compiled SimpleFSDP")
    return {"max_rel_error": worst, **_compiled_report("compiled SimpleFSDP", programs=2 * world)}


@scenario
def dtensor_manual_seed(rank: int, world: int) -> dict[str, Any]:
    """DTensor's manual_seed (over rank threads each rank makes its own random-op tracker and
    seeds its own device): every rank draws the same replicated tensor, the same again after
    seeding again, another after another seed, and shards of a sharded one that differ."""
    import torch.distributed.tensor as dt
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor._random import manual_seed
    dist.init_process_group("pjrt", timeout=timeout())
    mesh = init_device_mesh(dev().type, (world,))

    def replicated(seed: int) -> torch.Tensor:
        manual_seed(seed, mesh)
        return dt.rand(8, 4, device_mesh=mesh, placements=[dt.Replicate()]).to_local()

    first, again, other = replicated(7), replicated(7), replicated(8)
    exact(again, first.cpu(), "a replicated draw after the same seed")
    assert not torch.equal(other.cpu(), first.cpu()), "another seed drew the same values"
    everyone = [torch.empty_like(first) for _ in range(world)]
    dist.all_gather(everyone, first)
    for r, theirs in enumerate(everyone):
        exact(theirs, first.cpu(), f"rank {r}'s replicated draw")
    manual_seed(7, mesh)
    shards = dt.rand(4 * world, 4, device_mesh=mesh, placements=[dt.Shard(0)]).full_tensor().cpu().split(4)
    assert len({tuple(s.flatten().tolist()) for s in shards}) == world, "shards drew the same values"
    return {"tracker_device": str(dt._random._rng_tracker._device)}


@scenario
def rank_seeds(rank: int, world: int) -> dict[str, Any]:
    """torch.manual_seed(100 + rank) in each rank thread seeds that rank's device only (under
    torchrun each rank's process has its own): after every rank seeded, each draws what a
    generator seeded with its own seed gives; a second seeding says the CPU generator is shared."""
    import warnings
    dist.init_process_group("pjrt", timeout=timeout())
    torch.manual_seed(100 + rank)
    dist.barrier()  # every rank has seeded: a seed that reached other ranks' devices would show below
    got = torch.rand(4, device=dev())
    want = torch.rand(4, device=dev(), generator=torch.Generator(device=dev()).manual_seed(100 + rank))
    exact(got, want.cpu(), "a rank's draw after every rank seeded")
    everyone = [torch.empty(4, device=dev()) for _ in range(world)]
    dist.all_gather(everyone, got)
    assert len({tuple(t.cpu().tolist()) for t in everyone}) == world, "ranks drew the same values"
    message = ""
    if rank == 0:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.manual_seed(100)
        message = " ".join(str(w.message) for w in seen)
        assert "the CPU generator is one per process" in message, message
    dist.barrier()
    dist.destroy_process_group()
    return {"warning": message}


@scenario
def collectives_any_world(rank: int, world: int) -> dict[str, Any]:
    """The collectives over any number of ranks against CPU gloo's: integers bit for bit;
    float sums within float rounding (over more than two ranks the order of a sum is the
    transport's own; min, max and data movement stay exact)."""
    dist.init_process_group("cpu:gloo,pjrt:pjrt", timeout=timeout())
    R = dist.ReduceOp
    checked = []
    for dtype in (torch.int64, torch.int32, torch.float32):
        for op in (R.SUM, R.MIN, R.MAX, R.PRODUCT):
            x = values((5, 3), dtype, rank)
            got, want = x.to(dev()), x.clone()
            dist.all_reduce(got, op=op)
            dist.all_reduce(want, op=op)
            if dtype.is_floating_point and op == R.SUM:  # a sum in another order: within its rounding
                magnitude = x.abs()
                dist.all_reduce(magnitude)
                bound = world * torch.finfo(dtype).eps * magnitude
                assert ((got.cpu() - want).abs() <= bound).all(), f"all_reduce SUM {dtype}: {got.cpu()} vs {want}"
            elif dtype.is_floating_point and op == R.PRODUCT:  # no cancellation: relative rounding
                torch.testing.assert_close(got.cpu(), want, rtol=world * torch.finfo(dtype).eps, atol=0)
            else:
                exact(got, want, f"all_reduce {op} {dtype}")
            checked.append(f"all_reduce {op} {dtype}")
    x = values((2, 3), torch.int64, rank)
    out = torch.empty(world * 2, 3, dtype=torch.int64, device=dev())
    dist.all_gather_into_tensor(out, x.to(dev()))
    ref = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(ref, x)
    exact(out, torch.cat(ref), "all_gather_into_tensor")
    full = values((world * 3,), torch.int64, 10 + rank)
    got = torch.empty(3, dtype=torch.int64, device=dev())
    dist.reduce_scatter_tensor(got, full.to(dev()))
    want = full.clone()
    dist.all_reduce(want)
    exact(got, want.view(world, 3)[rank], "reduce_scatter_tensor")
    for root in (0, world - 1):
        b = values((4,), torch.float32, rank)
        want = b.clone()
        got = b.to(dev())
        dist.broadcast(got, src=root)
        dist.broadcast(want, src=root)
        exact(got, want, f"broadcast from {root}")
    x = values((world * 2, 2), torch.float32, rank)
    got = torch.empty_like(x, device=dev())
    dist.all_to_all_single(got, x.to(dev()))
    want = torch.empty_like(x)
    dist.all_to_all_single(want, x)
    exact(got, want, "all_to_all_single")
    # Rows that differ by sender and receiver (some none), as a mixture of experts routes
    # tokens; then splits equal on rank 0 only (the ranks must still take one path together).
    for sends in (lambda r: [(r + 2 * j) % 3 for j in range(world)],  # rank r's rows to each rank
                  lambda r: [2] * world if r == 0 else [2 + (r + j) % 2 for j in range(world)]):
        in_splits, out_splits = sends(rank), [sends(j)[rank] for j in range(world)]
        x = values((sum(in_splits), 2, 2), torch.float32, rank)
        got = torch.empty(sum(out_splits), 2, 2, device=dev())
        dist.all_to_all_single(got, x.to(dev()), out_splits, in_splits)
        want = torch.empty(sum(out_splits), 2, 2)
        dist.all_to_all_single(want, x, out_splits, in_splits)
        exact(got, want, f"all_to_all_single with split sizes {in_splits}")
    parts = [values((2,), torch.int64, 50 + j) for j in range(world)]
    got = torch.empty(2, dtype=torch.int64, device=dev())
    dist.scatter(got, [p.to(dev()) for p in parts] if rank == world - 1 else None, src=world - 1)
    exact(got, parts[rank], "scatter")
    # Point to point around the ring, twice with tags that arrive out of order, and a
    # receive from any source.
    right, left = (rank + 1) % world, (rank - 1) % world
    first, second = values((3,), torch.int32, rank), values((2, 2), torch.float32, rank)
    late = dist.isend(second.to(dev()), dst=right, tag=2)
    dist.send(first.to(dev()), dst=right, tag=1)
    got_first, got_second = torch.empty(3, dtype=torch.int32, device=dev()), torch.empty(2, 2, device=dev())
    dist.recv(got_second, src=left, tag=2)
    dist.recv(got_first, src=left, tag=1)
    late.wait()
    exact(got_first, values((3,), torch.int32, left), "send/recv around the ring (tag 1)")
    exact(got_second, values((2, 2), torch.float32, left), "isend/recv around the ring (tag 2)")
    if rank == 0:
        for _ in range(world - 1):  # each message is its sender's own
            source = dist.recv(got_first, tag=7)
            exact(got_first, values((3,), torch.int32, source), f"recv from any source (rank {source})")
    else:
        dist.send(first.to(dev()), dst=0, tag=7)
    # Receives match in the order they were posted, whatever order they are waited in; views
    # sent and received (a flattened [2, 3] tensor, a strided window).
    sent = [values((2, 3), torch.float32, 10 * rank + i) for i in range(2)]
    for s in sent:
        dist.isend(s.to(dev()).view(-1), dst=right, tag=8)
    windows = torch.zeros(2, 3, 4, device=dev())
    posted = [dist.irecv(windows[i, :, ::2], src=left, tag=8) for i in range(2)]
    posted[1].wait()
    while not posted[0].is_completed():
        pass
    for i in range(2):
        exact(windows[i, :, ::2].reshape(-1), values((2, 3), torch.float32, 10 * left + i).reshape(-1),
              f"irecv {i} into a view")
    assert windows[:, :, 1::2].abs().sum().item() == 0, "a receive wrote outside its view"
    dist.barrier()
    transport = dist.group.WORLD._get_backend(dev()).transport
    dist.destroy_process_group()
    return {"checked": checked, "transport": transport}


@scenario
def one_rank_raises(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 raises before a collective the others wait in: they raise too, in time."""
    dist.init_process_group("pjrt", timeout=timeout())
    dist.all_reduce(torch.ones(2, device=dev()))  # the group works
    if rank == 1:
        raise RuntimeError("rank 1 gives up")
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(2, device=dev()))
    except Exception as e:  # noqa: BLE001  (what the test wants to see)
        raise RuntimeError(f"the collective failed after {time.monotonic() - start:.1f} s: {e}") from e
    return {"no error": True}


@scenario
def one_rank_raises_holding_a_mesh(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 raises while its frame holds a device mesh and a DTensor; the others start a
    collective after it left (DTensor's seed broadcast for its first random op): they raise
    too, in time, not at the group's timeout."""
    import torch.distributed.tensor as dt
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("pjrt", timeout=timeout())
    mesh = init_device_mesh(dev().type, (world,))
    ones = dt.distribute_tensor(torch.ones(4, device=dev()), mesh, [dt.Replicate()])
    if rank == 1:
        raise RuntimeError("rank 1 gives up")
    time.sleep(2)  # rank 1 is gone by now
    start = time.monotonic()
    try:
        dt.rand(8, 4, device_mesh=mesh, placements=[dt.Replicate()]).to_local().cpu()
    except Exception as e:  # noqa: BLE001  (what the test wants to see)
        raise RuntimeError(f"the collective failed after {time.monotonic() - start:.1f} s: {e}") from e
    return {"no error": True, "ones": ones.to_local().sum().item()}


@scenario
def one_rank_raises_before_a_compiled_step(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 raises before the second call of a compiled step that holds a collective
    (inside its program): the others, launching their part, raise too, in time."""
    import torch.distributed._functional_collectives as funcol
    dist.init_process_group("pjrt", timeout=timeout())
    step = torch.compile(lambda t: funcol.all_reduce(t * 2, "sum", dist.group.WORLD) + 1, backend="pjrt")
    exact(step(torch.ones(2, device=dev())), torch.full((2,), 2.0 * world + 1), "the compiled step")
    if rank == 1:
        raise RuntimeError("rank 1 gives up")
    start = time.monotonic()
    try:
        step(torch.ones(2, device=dev())).cpu()
    except Exception as e:  # noqa: BLE001  (what the test wants to see)
        raise RuntimeError(f"the compiled step failed after {time.monotonic() - start:.1f} s: {e}") from e
    return {"no error": True}


@scenario
def a_late_rank(rank: int, world: int) -> dict[str, Any]:
    """Rank 0 comes late to each all-reduce while the others queue hundreds of programs
    behind their part of it (more than PJRT lets a device hold in flight, so their launches
    block): the late rank must still launch its part, so no rank may wait on another's
    device. Every value is exact (integers in float32)."""
    dist.init_process_group("pjrt", timeout=timeout())
    x = torch.ones(256, device=dev())
    adds = 2000
    for _ in range(3):
        if rank == 0:
            time.sleep(1.0)
        dist.all_reduce(x)
        for _ in range(adds):
            x = x + 1.0
        x = (x - adds) / world
    torch_pjrt.synchronize()
    assert torch.equal(x.cpu(), torch.ones(256)), x.cpu()[:4]
    dist.destroy_process_group()
    return {"value": x[0].item()}


@scenario
def uneven_2d_redistribute(rank: int, world: int) -> dict[str, Any]:
    """A tensor sharded unevenly over both dimensions of a 2-D mesh, made whole again on
    every rank: DTensor pads each row's shards to its own sizes before each all-gather
    (the plan depends on the rank's place in the mesh)."""
    import torch.distributed.tensor as dt
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("pjrt", timeout=timeout(), device_id=dev())
    mesh = init_device_mesh(dev().type, (2, world // 2))
    full = torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)
    sharded = dt.distribute_tensor(full.to(dev()), mesh, [dt.Shard(0), dt.Shard(0)])
    whole = sharded.redistribute(mesh, [dt.Replicate(), dt.Replicate()]).to_local()
    exact(whole, full, f"rank {rank} (mesh coordinate {mesh.get_coordinate()}): 7 rows sharded twice, gathered")
    dist.destroy_process_group()
    return {"coordinate": mesh.get_coordinate()}


@scenario
def split_mesh(rank: int, world: int) -> dict[str, Any]:
    """init_process_group(device_id=...) (as Lightning passes it) makes DeviceMesh split the
    group: a 2-D mesh's row and column groups, each all-reduce's values against the ranks'."""
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("pjrt", timeout=timeout(), device_id=dev())
    rows = 2
    mesh = init_device_mesh(dev().type, (rows, world // rows), mesh_dim_names=("replicate", "shard"))
    checked = []
    for dim, name in enumerate(("replicate", "shard")):
        group = mesh.get_group(name)
        members = dist.get_process_group_ranks(group)
        assert rank in members and len(members) == mesh.shape[dim], (name, members)
        x = torch.full((3,), float(rank + 1), device=dev()) * torch.arange(1, 4, device=dev())
        dist.all_reduce(x, group=group)
        want = float(sum(m + 1 for m in members)) * torch.arange(1, 4, dtype=torch.float32)
        exact(x, want, f"all_reduce over the mesh's {name} group {members}")
        gathered = [torch.empty(1, device=dev()) for _ in members]
        dist.all_gather(gathered, torch.tensor([float(rank)], device=dev()), group=group)
        exact(torch.cat(gathered), torch.tensor([float(m) for m in members]), f"all_gather over {name}")
        checked.append(members)
    dist.destroy_process_group()
    return {"groups": checked}


@scenario
def checkpoint(rank: int, world: int) -> dict[str, Any]:
    """Save a sharded FSDP2 model and optimizer with `world` ranks; the test
    then loads it with one rank (a different world size) and compares."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    dist.init_process_group("pjrt", timeout=timeout())
    ckpt = os.path.join(os.environ["DIST_TEST_OUT"], "ckpt")
    model = _mlp().to(dev())
    fully_shard(model)  # sharded over this run's world: 2 ranks save, 1 loads
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    full = lambda t: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu()  # noqa: E731
    if os.environ["DIST_CKPT_MODE"] == "save":
        for step in range(2):
            x, y = _local_batch(step, rank, world)
            opt.zero_grad()
            F.mse_loss(model(x.to(dev())), y.to(dev())).backward()
            opt.step()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
        expected = {k: full(v) for k, v in msd.items()}
        if rank == 0:
            torch.save(expected, os.path.join(os.environ["DIST_TEST_OUT"], "expected.pt"))
        result = {"saved": sorted(expected)}
    else:
        x, y = _local_batch(0, rank, world)
        F.mse_loss(model(x.to(dev())), y.to(dev())).backward()
        opt.step()  # creates the optimizer state to load into
        opt.zero_grad()
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=ckpt)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        expected = torch.load(os.path.join(os.environ["DIST_TEST_OUT"], "expected.pt"))
        loaded = {k: full(v) for k, v in get_state_dict(model, opt)[0].items()}
        for k, v in expected.items():
            exact(loaded[k].to(dev()), v, f"loaded {k}")
        exp_avg = [full(s["exp_avg"]) for s in get_state_dict(model, opt)[1]["state"].values()]
        assert all(torch.isfinite(e).all() and e.abs().sum() > 0 for e in exp_avg), "optimizer state not loaded"
        result = {"loaded": sorted(loaded)}
    dist.destroy_process_group()
    return result


def main() -> None:
    name, out_dir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    os.environ["DIST_TEST_OUT"] = out_dir
    path = os.path.join(out_dir, f"rank{rank}.json")
    try:
        result = {"ok": True, **SCENARIOS[name](rank, world)}
    except BaseException:  # noqa: BLE001  (reported to the test)
        result = {"ok": False, "error": traceback.format_exc()}
    with open(path, "w") as f:
        json.dump(result, f, default=str)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
