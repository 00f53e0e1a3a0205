"""Collectives on the plugin's devices (the `collectives.*` checks).

- `collectives.devices`: every collective the `pjrt` process group has (all-reduce with
  every reduce op, all-gather, reduce-scatter, broadcast, reduce, gather, scatter,
  all-to-all with equal and unequal splits, send/recv, barrier) over N rank threads of
  one process, one device each: the XLA transport, programs over the devices. Values are
  checked against the same reductions on the CPU of the ranks' inputs (each rank's input
  is a known function of its rank): data movement, minima, maxima and integer sums bit
  for bit, float sums and products within their rounding. No byte may go through the
  host. It runs in a child process (`python -m torch_pjrt.qualify.collectives N OUT`):
  the CPU plugin makes its devices at start (TORCH_PJRT_CPU_DEVICES), and a failing
  collective must not take the battery down with it.
- `collectives.cross-process`: two processes (`python -m torch_pjrt.qualify.collectives
  processes RANK 2 STORE OUT`) make a `pjrt` group, which asks the plugin for one client
  over both (`node_id`/`num_nodes`, its key-value exchange through the group's store),
  and run an all-reduce. What the plugin did is reported as observed: a client of each
  process's devices only (XLA's CPU plugin takes the options and cannot join processes)
  is a SKIP naming that; so is a client over both processes, because torch_pjrt's XLA
  transport does not run between processes yet (its collectives go through the host).
  The all-reduce's values are checked either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import torch
import torch.distributed as dist

WORLD = 4  # rank threads on the CPU plugin (its devices are made for the child process)
TIMEOUT_S = 240


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s input: known to every rank, so each can compute the expected result."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(1, 6, shape, generator=g).to(dtype)  # small: products stay in range


def _expect(got: torch.Tensor, want: torch.Tensor, what: str, rtol: float = 0.0, bound: torch.Tensor | None = None) -> None:
    got = got.cpu()
    if bound is not None:
        err = (got.double() - want.double()).abs()
        assert bool((err <= bound).all()), f"{what}: off by {err.max().item():.3g}, beyond its rounding"
    else:
        torch.testing.assert_close(got, want, rtol=rtol, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


def _reduce(stack: torch.Tensor, op: dist.ReduceOp.RedOpType) -> torch.Tensor:
    R = dist.ReduceOp
    if op == R.SUM:
        return stack.sum(0, dtype=stack.dtype) if stack.dtype != torch.bool else stack.any(0)
    if op == R.PRODUCT:
        return stack.prod(0, dtype=stack.dtype) if stack.dtype != torch.bool else stack.all(0)
    if op == R.MIN:
        return stack.amin(0) if stack.dtype != torch.bool else stack.all(0)
    if op == R.MAX:
        return stack.amax(0) if stack.dtype != torch.bool else stack.any(0)
    out = stack[0].clone()
    for x in stack[1:]:
        out = out & x if op == R.BAND else out | x if op == R.BOR else out ^ x
    return out


def rank_checks(rank: int, world: int) -> dict[str, Any]:
    """Every collective over the world's rank threads; raises on the first wrong value."""
    import torch_pjrt

    dev = torch.device(torch_pjrt.DEVICE_NAME, getattr(torch, torch_pjrt.DEVICE_NAME).current_device())
    dist.init_process_group("pjrt")
    R = dist.ReduceOp
    checked: list[str] = []
    everyone = range(world)
    reductions = {torch.float32: (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG), torch.bfloat16: (R.SUM, R.MAX),
                  torch.int64: (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR),
                  torch.int32: (R.SUM, R.MIN, R.MAX), torch.uint8: (R.MAX, R.BXOR), torch.bool: (R.MAX, R.MIN)}
    for seed, (dtype, ops) in enumerate(reductions.items()):
        xs = [_inputs((6, 5), dtype, seed, r) for r in everyone]
        stack = torch.stack(xs)
        for op in ops:
            got = xs[rank].to(dev)
            dist.all_reduce(got, op=op)
            name = f"all_reduce {op} {dtype}"
            if dtype.is_floating_point and op in (R.SUM, R.AVG, R.PRODUCT):
                eps = torch.finfo(dtype).eps
                exact = stack.double().sum(0) if op != R.PRODUCT else stack.double().prod(0)
                if op == R.AVG:
                    exact = exact / world
                # a sum (or product) of `world` terms in any order, rounded to dtype at each step
                scale = stack.double().abs().sum(0) if op != R.PRODUCT else exact.abs()
                _expect(got, exact, name, bound=(world + 1) * eps * scale / (world if op == R.AVG else 1))
            else:
                _expect(got, _reduce(stack, op), name)
            checked.append(name)
    for dtype in (torch.float32, torch.float16, torch.int64, torch.bool):
        xs = [_inputs((3, 4), dtype, 20, r) for r in everyone]
        out = torch.empty(world * 3, 4, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(out, xs[rank].to(dev))
        _expect(out, torch.cat(xs), f"all_gather_into_tensor {dtype}")
        parts = [torch.empty(3, 4, dtype=dtype, device=dev) for _ in everyone]
        dist.all_gather(parts, xs[rank].to(dev))
        _expect(torch.cat(parts), torch.cat(xs), f"all_gather {dtype}")
        checked += [f"all_gather_into_tensor {dtype}", f"all_gather {dtype}"]
    fulls = [_inputs((world * 3,), torch.int64, 30, r) for r in everyone]
    got = torch.empty(3, dtype=torch.int64, device=dev)
    dist.reduce_scatter_tensor(got, fulls[rank].to(dev), op=R.MAX)
    _expect(got, torch.stack(fulls).amax(0).view(world, 3)[rank], "reduce_scatter_tensor MAX")
    got = torch.empty(3, dtype=torch.int64, device=dev)
    dist.reduce_scatter(got, [c.to(dev) for c in fulls[rank].chunk(world)])
    _expect(got, torch.stack(fulls).sum(0).view(world, 3)[rank], "reduce_scatter SUM")
    checked += ["reduce_scatter_tensor", "reduce_scatter"]
    for root in (0, world - 1):
        xs = [_inputs((5,), torch.float32, 40 + root, r) for r in everyone]
        got = xs[rank].to(dev)
        dist.broadcast(got, src=root)
        _expect(got, xs[root], f"broadcast from {root}")
        ints = [_inputs((5,), torch.int32, 50 + root, r) for r in everyone]
        got = ints[rank].to(dev)
        dist.reduce(got, dst=root, op=R.MIN)
        if rank == root:
            _expect(got, torch.stack(ints).amin(0), f"reduce to {root}")
        gathered = [torch.empty(5, dtype=torch.int32, device=dev) for _ in everyone] if rank == root else None
        dist.gather(ints[rank].to(dev), gathered, dst=root)
        if gathered is not None:
            _expect(torch.cat(gathered), torch.cat(ints), f"gather to {root}")
        chunks = [_inputs((2, 3), torch.int64, 60 + j, root) for j in everyone]
        got = torch.empty(2, 3, dtype=torch.int64, device=dev)
        dist.scatter(got, [c.to(dev) for c in chunks] if rank == root else None, src=root)
        _expect(got, chunks[rank], f"scatter from {root}")
        checked += [f"broadcast from {root}", f"reduce to {root}", f"gather to {root}", f"scatter from {root}"]
    # all-to-all: equal splits, then rows that differ by sender and receiver (some none)
    xs = [_inputs((world * 2, 3), torch.float32, 70, r) for r in everyone]
    got = torch.empty(world * 2, 3, device=dev)
    dist.all_to_all_single(got, xs[rank].to(dev))
    _expect(got, torch.cat([x[2 * rank:2 * rank + 2] for x in xs]), "all_to_all_single")
    for sends in ([[(r + 2 * j) % 3 for j in everyone] for r in everyone],  # sends[r][j]: rows r sends j
                  [[2] * world if r == 0 else [2 + (r + j) % 2 for j in everyone] for r in everyone]):
        xs = [_inputs((sum(sends[r]), 2), torch.int64, 80, r) for r in everyone]
        out_splits = [sends[r][rank] for r in everyone]
        got = torch.empty(sum(out_splits), 2, dtype=torch.int64, device=dev)
        dist.all_to_all_single(got, xs[rank].to(dev), out_splits, sends[rank])
        want = torch.cat([xs[r].split(sends[r])[rank] for r in everyone])
        _expect(got, want, f"all_to_all_single with splits {sends[rank]}")
    outs = [torch.empty(2, dtype=torch.int32, device=dev) for _ in everyone]
    dist.all_to_all(outs, [_inputs((2,), torch.int32, 90 + j, rank).to(dev) for j in everyone])
    _expect(torch.cat(outs), torch.cat([_inputs((2,), torch.int32, 90 + rank, r) for r in everyone]), "all_to_all")
    checked += ["all_to_all_single", "all_to_all_single with unequal splits", "all_to_all"]
    # point to point around the ring (a view sent, into a view), and a receive from any source
    right, left = (rank + 1) % world, (rank - 1) % world
    sent = dist.isend(_inputs((2, 3), torch.float32, 100, rank).to(dev).view(-1), dst=right)
    got = torch.zeros(2, 6, device=dev)
    dist.recv(got[:, ::2], src=left)
    sent.wait()
    _expect(got[:, ::2], _inputs((2, 3), torch.float32, 100, left), "send/recv around the ring")
    _expect(got[:, 1::2], torch.zeros(2, 3), "recv into a view (outside it)")
    if rank == 0:
        got = torch.empty(4, device=dev)
        for _ in range(world - 1):
            source = dist.recv(got, tag=3)
            _expect(got, _inputs((4,), torch.float32, 110, source), f"recv from any source (rank {source})")
    else:
        dist.send(_inputs((4,), torch.float32, 110, rank).to(dev), dst=0, tag=3)
    dist.barrier()
    checked += ["send/recv", "recv from any source", "barrier"]
    checked += _compiled_checks(rank, world, dev)
    transport = dist.group.WORLD._get_backend(dev).transport
    dist.destroy_process_group()
    return {"checked": checked, "transport": transport}


def _compiled_checks(rank: int, world: int, dev: torch.device) -> list[str]:
    """Collectives inside a torch.compile program (one replica per rank's device): a step
    that reduces, gathers and reduce-scatters, run twice on new values (the capture, then a
    replay), every result against the host's, and the step one program, not run eagerly."""
    import torch.distributed._functional_collectives as funcol

    from ..metrics import metrics

    group = dist.group.WORLD

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        total = funcol.all_reduce(x * 2, "sum", group) + 1
        gathered = funcol.all_gather_tensor(total, 0, group)
        return total, gathered, funcol.reduce_scatter_tensor(gathered, "max", 0, group)

    compiled = torch.compile(step, backend="pjrt")
    for call in range(2):
        xs = [_inputs((world, 3), torch.int64, 120 + call, r).float() for r in range(world)]
        total, gathered, scattered = compiled(xs[rank].to(dev))
        want = sum(x * 2 for x in xs) + 1
        _expect(total, want, f"compiled all_reduce (call {call})")
        _expect(gathered, torch.cat([want] * world), f"compiled all_gather (call {call})")
        _expect(scattered, want, f"compiled reduce_scatter (call {call})")  # every rank gathered the same
    dist.barrier()  # every rank's step is in the counters
    stats = metrics()
    eager = [why for f in stats["compiled"].values() for why in f["eager_graphs"]]
    assert not eager, f"the compiled step with collectives did not stay one program: {eager}"
    assert stats["distributed"]["in_programs"] > 0, "the compiled step's collectives did not run inside its program"
    return ["all_reduce, all_gather and reduce_scatter inside a compiled program"]


def devices_check(device_count: int, is_cpu_plugin: bool) -> str:
    """Runs rank_checks in a child process over WORLD (CPU plugin) or every device."""
    world = WORLD if is_cpu_plugin else device_count
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_PJRT_DIST_IN_PROGRAMS="1")
    if is_cpu_plugin:
        env["TORCH_PJRT_CPU_DEVICES"] = str(world)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "collectives.json")
        proc = subprocess.run([sys.executable, "-m", "torch_pjrt.qualify.collectives", str(world), out], env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        if proc.returncode != 0:
            # each rank's error line (rank_checks names the collective), else the output's end
            errors = [line for line in proc.stderr.splitlines() if line.startswith("rank ") or "Error: " in line]
            raise AssertionError(f"over {world} devices: " + ("\n".join(errors[-16:]) or proc.stderr[-3000:]))
        with open(out) as f:
            result = json.load(f)
    transports = {r["transport"] for r in result["reports"]}
    stats = result["transport_stats"]
    assert transports == {"xla"}, f"the ranks used the {transports} transport, not programs over the devices"
    assert stats["host_bytes"] == 0, f"{stats['host_bytes']} bytes went through the host"
    checked = result["reports"][0]["checked"]
    return f"{len(checked)} collectives over {world} devices, {stats['collectives'].get('xla', 0)} runs, " \
           f"{stats['in_programs']} more inside compiled programs, 0 bytes through the host"


class Unsupported(Exception):
    """What the plugin cannot do, as observed: the check's verdict is SKIP, with this reason."""


def _process_rank(rank: int, world: int, store_path: str, out: str) -> None:
    """One of `world` processes: a pjrt group over a file store, one all-reduce."""
    from torch_pjrt.distributed import DEVICE, transport_stats

    dist.init_process_group("pjrt", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    got = _inputs((64,), torch.float32, 7, rank).to(DEVICE)
    dist.all_reduce(got)
    terms = torch.stack([_inputs((64,), torch.float32, 7, r) for r in range(world)]).double()
    # a float32 sum of `world` terms in any order: within (world + 1) half-ulps of their magnitudes
    _expect(got, terms.sum(0), "all_reduce between processes", bound=(world + 1) * 2 ** -24 * terms.abs().sum(0))
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(transport_stats(), f)


def cross_process_check() -> str:
    """PASS is for a transport that runs between processes, which torch_pjrt does not have
    yet: until then the verdict is SKIP, saying what the plugin did, or FAIL."""
    world = 2
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen([sys.executable, "-m", "torch_pjrt.qualify.collectives", "processes", str(rank),
                                   str(world), os.path.join(tmp, "store"), os.path.join(tmp, f"{rank}.json")],
                                  env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for rank in range(world)]
        try:
            outputs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
        finally:
            for p in procs:  # one that hangs (a peer that never joined) must not outlive the check
                if p.poll() is None:
                    p.kill()
                    p.wait()
        failed = [f"process {rank}: {out[-2000:]}" for rank, (p, out) in enumerate(zip(procs, outputs))
                  if p.returncode != 0]
        if failed:
            raise AssertionError("\n".join(failed))
        stats = []
        for rank in range(world):
            with open(os.path.join(tmp, f"{rank}.json")) as f:
                stats.append(json.load(f))
    processes = stats[0]["processes"]
    if processes is None:
        raise AssertionError("the processes' group did not start the runtime (a device was used before it)")
    if processes["why_not"]:
        raise Unsupported(f"no client over {world} processes: {processes['why_not']}; their collectives (values "
                          f"right) went through the host (gloo)")
    raise Unsupported(f"the plugin's client spans the {world} processes, but torch_pjrt's XLA transport does not "
                      f"run between processes yet: their collectives (values right) went through the host")


def main() -> None:
    from torch_pjrt.distributed import spawn, transport_stats

    if sys.argv[1] == "processes":
        _process_rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    world, out = int(sys.argv[1]), sys.argv[2]
    reports = spawn(rank_checks, args=(world,), nprocs=world, prefix_output=True)
    with open(out, "w") as f:
        json.dump({"reports": reports, "transport_stats": transport_stats()}, f)


if __name__ == "__main__":
    main()
