"""A Hugging Face training script as written for an NVIDIA GPU (for the doctor:
`python -m torch_pjrt.doctor --parity examples/hf_gpt2_cuda.py`).

A small GPT-2 config (no download), AdamW, bf16 autocast, a compiled
forward, the loss printed every step. Nothing in it names pjrt."""

from __future__ import annotations

import argparse

import torch
import transformers


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                                  attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    forward = torch.compile(model) if args.compile else model
    ids = torch.randint(0, 256, (8, 64), device=device)
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}")
    print(f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
