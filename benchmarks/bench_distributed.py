"""torch.distributed benchmark (not a test): all_reduce bandwidth of the pjrt
backend next to gloo on CPU tensors, and the DDP training step with 1 and 2
processes on pjrt next to the same on CPU over gloo, in one run; then 4 ranks as
threads of one process (torch_pjrt.distributed.spawn): all_reduce and all_gather
latency and bandwidth through the XLA transport next to the host-staged one and to
gloo on CPU tensors, an FSDP2 step with either transport, and TorchTitan's SimpleFSDP
step eager and under torch.compile (its collectives inside the programs).

    .venv/bin/python benchmarks/bench_distributed.py [--iters N] [--steps N] [--only processes|threads]

The driver launches the ranks itself with torchrun (--standalone, on this
machine). Bandwidth is the algorithm bandwidth of all_reduce SUM on float32:
bytes per rank / seconds per call, each timed loop ending in a device
synchronize. "pjrt, no check" skips the signature exchange that makes
mismatched calls raise (TORCH_PJRT_DIST_CHECK=0). On a machine with fewer
cores than processes x threads, the ranks compete for cores: compare columns
of one run, not runs on different machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Callable

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _timed(fn, device: str, iters: int) -> float:
    """Seconds per call: the best of 3 loops of `iters` calls, after one call."""
    from torch_pjrt.bench import time_loop

    return min(time_loop(fn, device, iters, warmup=1, repeats=3)[1])


def worker_bandwidth(out: str, iters: int) -> None:
    import torch
    import torch.distributed as dist

    import torch_pjrt  # noqa: F401

    dist.init_process_group("cpu:gloo,pjrt:pjrt")
    os.environ["TORCH_PJRT_DIST_CHECK"] = "0"
    unchecked = dist.new_group(backend="pjrt")
    dev = torch.device("pjrt", 0)
    rows = []
    for size in SIZES:
        n = size // 4
        n_iters = max(3, min(iters, (32 << 20) // size))
        cpu = torch.ones(n)
        pj = torch.ones(n, device=dev)
        t_cpu = _timed(lambda: dist.all_reduce(cpu), "cpu", n_iters)
        t_pjrt = _timed(lambda: dist.all_reduce(pj), "pjrt", n_iters)
        t_raw = _timed(lambda: dist.all_reduce(pj, group=unchecked), "pjrt", n_iters)
        rows.append({"bytes": size, "gloo_cpu": size / t_cpu, "pjrt": size / t_pjrt, "pjrt_nocheck": size / t_raw})
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def worker_ddp(out: str, device: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("pjrt" if device == "pjrt" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("pjrt", 0) if device == "pjrt" else torch.device("cpu")
    torch.manual_seed(0)
    ms = _median_step_ms(lambda model: DistributedDataParallel(model.to(dev)), dev, rank, steps)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"ms": ms, "tokens_per_s": world * BATCH * SEQ / (ms / 1e3)}, f)
    dist.destroy_process_group()


VOCAB, SEQ, BATCH = 256, 64, 8


def _median_step_ms(wrap: Callable[[Any], Any], dev: Any, rank: int, steps: int) -> float:
    """Median milliseconds of one AdamW step of the example transformer, wrapped by `wrap`
    (DDP, FSDP2), on this rank's own synthetic batch."""
    import torch
    import torch.nn.functional as F

    from torch_pjrt.bench import time_loop

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    from models import TinyTransformer, synthetic_tokens

    model = wrap(TinyTransformer(vocab=VOCAB, dim=128, heads=4, layers=2, seq=SEQ))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (t.to(dev) for t in synthetic_tokens(BATCH, SEQ, VOCAB, seed=rank))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).backward()
        opt.step()

    _, times = time_loop(step, dev.type, 1, warmup=3, repeats=steps)
    return statistics.median(times) * 1e3


THREADS = 4


def _thread_rank_bandwidth(rank: int, iters: int) -> list[dict[str, float]]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("cpu:gloo,pjrt:pjrt")
    xla = dist.group.WORLD
    os.environ["TORCH_PJRT_DIST_TRANSPORT"] = "host"  # every rank sets it before the next group
    host = dist.new_group(backend="pjrt")
    dist.barrier(group=xla)
    os.environ["TORCH_PJRT_DIST_TRANSPORT"] = "auto"
    dev = torch.device("pjrt", rank)
    rows = []
    for size in SIZES:
        n = size // 4
        n_iters = max(3, min(iters, (32 << 20) // size))
        row: dict[str, float] = {"bytes": size}
        for op in ("all_reduce", "all_gather"):
            cpu, pj = torch.ones(n), torch.ones(n, device=dev)
            cpu_out = torch.empty(n * THREADS)
            pj_out = torch.empty(n * THREADS, device=dev)
            if op == "all_reduce":
                calls = {"gloo_cpu": (lambda: dist.all_reduce(cpu), "cpu"),
                         "xla": (lambda: dist.all_reduce(pj, group=xla), "pjrt"),
                         "host": (lambda: dist.all_reduce(pj, group=host), "pjrt")}
            else:
                calls = {"gloo_cpu": (lambda: dist.all_gather_into_tensor(cpu_out, cpu), "cpu"),
                         "xla": (lambda: dist.all_gather_into_tensor(pj_out, pj, group=xla), "pjrt"),
                         "host": (lambda: dist.all_gather_into_tensor(pj_out, pj, group=host), "pjrt")}
            for name, (fn, device) in calls.items():
                row[f"{op}_{name}"] = _timed(fn, device, n_iters)
        rows.append(row)
    dist.destroy_process_group()
    return rows


def _thread_rank_fsdp(rank: int, steps: int, transport: str) -> float:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    os.environ["TORCH_PJRT_DIST_TRANSPORT"] = transport
    dist.init_process_group("pjrt")
    dev = torch.device("pjrt", rank)

    def shard(model: Any) -> Any:
        model = model.to(dev)
        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)

    ms = _median_step_ms(shard, dev, rank, steps)
    dist.destroy_process_group()
    return ms


def _thread_rank_simple_fsdp(rank: int, steps: int, compiled: bool) -> dict[str, Any]:
    """TorchTitan's SimpleFSDP (sharded DTensor parameters gathered in the forward), eager, or
    under torch.compile with its all-gathers and reduce-scatters inside the step's programs."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.experiments.graph_trainer.simple_fsdp import data_parallel

    os.environ["TORCH_PJRT_DIST_TRANSPORT"] = "xla"  # (the FSDP2 runs before left it at host)
    dist.init_process_group("pjrt")
    dev = torch.device("pjrt", rank)
    mesh = init_device_mesh("pjrt", (THREADS,))

    def shard(model: Any) -> Any:
        model = data_parallel(model.to(dev), mesh, mode="fully_shard")
        return torch.compile(model, backend="pjrt") if compiled else model

    import torch_pjrt

    ms = _median_step_ms(shard, dev, rank, steps)
    dist.barrier()
    stats = torch_pjrt.metrics()
    dist.destroy_process_group()
    return {"ms": ms, "in_programs": stats["distributed"]["in_programs"],
            "eager_graphs": [why for f in stats["compiled"].values() for why in f["eager_graphs"]]}


def worker_threads(out: str, iters: int, steps: int) -> None:
    import torch_pjrt.distributed as pjrt_dist

    bandwidth = pjrt_dist.spawn(_thread_rank_bandwidth, args=(iters,), nprocs=THREADS, prefix_output=False)[0]
    fsdp = {t: pjrt_dist.spawn(_thread_rank_fsdp, args=(steps, t), nprocs=THREADS, prefix_output=False)[0]
            for t in ("xla", "host")}
    simple = {("compiled" if c else "eager"): pjrt_dist.spawn(_thread_rank_simple_fsdp, args=(steps, c),
                                                               nprocs=THREADS, prefix_output=False)[0]
              for c in (False, True)}
    with open(out, "w") as f:
        json.dump({"bandwidth": bandwidth, "fsdp_ms": fsdp, "simple_fsdp_ms": simple,
                   "transport": pjrt_dist.transport_stats()}, f)


def _print_threads(result: dict) -> None:
    print(f"\n{THREADS} ranks as threads of one process, one pjrt device each (torch_pjrt.distributed.spawn): "
          "latency ms and algorithm bandwidth MB/s")
    print(f"{'size':>8} | {'all_reduce: xla':>16} {'host':>14} {'gloo CPU':>14} | {'all_gather: xla':>16} "
          f"{'host':>14} {'gloo CPU':>14}")
    for r in result["bandwidth"]:
        size = r["bytes"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        cells = []
        for op in ("all_reduce", "all_gather"):
            for name in ("xla", "host", "gloo_cpu"):
                t = r[f"{op}_{name}"]
                cells.append(f"{t * 1e3:6.2f} {size / t / 1e6:7.0f}")
        print(f"{label:>8} | {cells[0]:>16} {cells[1]:>14} {cells[2]:>14} | {cells[3]:>16} {cells[4]:>14} "
              f"{cells[5]:>14}")
    fsdp = result["fsdp_ms"]
    print(f"FSDP2 step, GPT-style decoder (2 x d128, 8x64 tokens per rank, AdamW), {THREADS} rank threads, median ms: "
          f"XLA transport {fsdp['xla']:.1f}, host-staged {fsdp['host']:.1f}")
    simple = result["simple_fsdp_ms"]
    compiled = simple["compiled"]
    print(f"SimpleFSDP step (the same model and batch, XLA transport), median ms: eager {simple['eager']['ms']:.1f}, "
          f"torch.compile {compiled['ms']:.1f} ({compiled['in_programs']} collective runs inside its programs; "
          f"graphs run eagerly: {compiled['eager_graphs'] or 'none'})")


def launch(nproc: int, *worker_args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           __file__, "--worker", *worker_args]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // nproc)))
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--only", choices=["processes", "threads"])
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        kind, out, *rest = args.worker
        if kind == "bandwidth":
            worker_bandwidth(out, args.iters)
        elif kind == "threads":
            worker_threads(out, args.iters, args.steps)
        else:
            worker_ddp(out, rest[0], args.steps)
        return
    if args.only != "threads":
        _processes(args)
    if args.only != "processes":
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "threads.json")
            env = dict(os.environ, TORCH_PJRT_CPU_DEVICES=str(THREADS), OMP_NUM_THREADS="1")
            subprocess.run([sys.executable, __file__, "--iters", str(args.iters), "--steps", str(args.steps),
                            "--worker", "threads", out], env=env, check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                _print_threads(json.load(f))


def _processes(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bw = os.path.join(tmp, "bw.json")
        launch(2, "bandwidth", bw, "--iters", str(args.iters))
        ddp = {}
        for device in ("pjrt", "cpu"):
            for nproc in (1, 2):
                path = os.path.join(tmp, f"ddp_{device}_{nproc}.json")
                launch(nproc, "ddp", path, device, "--steps", str(args.steps))
                with open(path) as f:
                    ddp[device, nproc] = json.load(f)
        with open(bw) as f:
            rows = json.load(f)

    print(f"all_reduce SUM float32, 2 processes, algorithm bandwidth MB/s ({os.cpu_count()} cores)")
    print(f"{'size':>8} {'gloo CPU':>10} {'pjrt':>10} {'pjrt/gloo':>10} {'pjrt, no check':>15}")
    for r in rows:
        size = r["bytes"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        print(f"{label:>8} {r['gloo_cpu'] / 1e6:>10.1f} {r['pjrt'] / 1e6:>10.1f} {r['pjrt'] / r['gloo_cpu']:>10.2f} "
              f"{r['pjrt_nocheck'] / 1e6:>15.1f}")
    print("\nDDP training step, GPT-style decoder (2 layers x d128, 8x64 tokens per rank, AdamW), median ms")
    print(f"{'':>18} {'1 process':>10} {'2 processes':>12} {'tokens/s 1':>11} {'tokens/s 2':>11}")
    for device, label in (("pjrt", "pjrt (pjrt PG)"), ("cpu", "CPU (gloo PG)")):
        one, two = ddp[device, 1], ddp[device, 2]
        print(f"{label:>18} {one['ms']:>10.1f} {two['ms']:>12.1f} {one['tokens_per_s']:>11,.0f} "
              f"{two['tokens_per_s']:>11,.0f}")


if __name__ == "__main__":
    main()
