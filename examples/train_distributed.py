"""Data-parallel training of the GPT-style decoder on pjrt, with DDP or FSDP2.

    .venv/bin/torchrun --nproc-per-node 2 examples/train_distributed.py --strategy ddp
    .venv/bin/torchrun --nproc-per-node 2 examples/train_distributed.py --strategy fsdp

Each rank trains on its own slice of the global batch; rank 0 prints the loss
(averaged over the ranks) and the global tokens/s. The script is what a CUDA
script would be with "nccl" -> "pjrt" and "cuda" -> "pjrt".
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from models import TinyTransformer, synthetic_tokens  # noqa: E402

import torch_pjrt  # noqa: E402,F401  (also autoloaded by `import torch`)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()

    dist.init_process_group("pjrt")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("pjrt", torch.pjrt.current_device())
    torch.manual_seed(0)  # the same initial model on every rank
    model = TinyTransformer(vocab=args.vocab, dim=args.dim, heads=4, layers=args.layers, seq=args.seq).to(device)
    if args.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = (t.to(device) for t in synthetic_tokens(args.batch, args.seq, args.vocab, seed=rank))

    start = time.perf_counter()
    for step in range(args.steps):
        if step == args.warmup:
            torch.pjrt.synchronize()
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        if step % 5 == 0 or step == args.steps - 1:
            mean = loss.detach().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:>3}  loss {mean.item():.4f}", flush=True)
    torch.pjrt.synchronize()
    elapsed = time.perf_counter() - start
    tokens = world * args.batch * args.seq * (args.steps - args.warmup)
    if rank == 0:
        print(f"{args.strategy}, {world} ranks on {torch_pjrt.platform()['platform']}: "
              f"{tokens / elapsed:,.0f} tokens/s over {args.steps - args.warmup} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
