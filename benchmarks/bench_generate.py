"""Decode throughput of Hugging Face generate() (not a test): greedy, batch 2, a
16-token prompt and 64 new tokens, for GPT-2 and Llama small configs, side by side
in one run:

  compiled: the forward torch.compile'd with backend="pjrt", static KV cache
            (cache_implementation="static": one program per step shape, replayed);
  strict / fused: pjrt eager modes, the default dynamic cache;
  cpu:      PyTorch CPU eager, the default dynamic cache.

Each figure is the median of --repeats generate() calls after one warm-up call
(compiles, cache fill), each ending in a device sync; tokens/s counts new tokens
of the whole batch. The compiled column also shows the compiles its timed calls did.

  .venv/bin/python benchmarks/bench_generate.py [--repeats N] [--new-tokens N]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt.bench import time_call, time_loop  # noqa: E402

VOCAB = 256


def make_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=128, n_layer=2, n_head=4,
                                      attn_implementation="sdpa")
        return transformers.GPT2LMHeadModel(cfg).eval()
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg).eval()


def tokens_per_s(model: torch.nn.Module, device: str, new_tokens: int, repeats: int,
                 static: bool) -> tuple[float, int, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1)).to(device)
    mask = torch.ones_like(ids)
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    if static:
        kw["cache_implementation"] = "static"

    def run() -> torch.Tensor:
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, **kw)

    time_call(run, device)  # warm-up: compiles, cache fill
    compiles = torch_pjrt.metrics()["compiles"]
    out, times = time_loop(run, device, 1, repeats=repeats)
    return ids.shape[0] * new_tokens / statistics.median(times), torch_pjrt.metrics()["compiles"] - compiles, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"torch.get_num_threads() = {torch.get_num_threads()}; greedy generate(), batch 2, 16-token prompt, "
          f"{args.new_tokens} new tokens; tokens/s, median of {args.repeats} calls after one warm-up")
    print(f"  {'model':<22}{'compiled':>10}{'strict':>10}{'fused':>10}{'cpu':>10}{'compiled/cpu':>14}"
          f"{'timed compiles':>16}  tokens equal")
    for kind in ("gpt2", "llama"):
        base = make_model(kind)
        cpu_tps, _, cpu_out = tokens_per_s(copy.deepcopy(base), "cpu", args.new_tokens, args.repeats, static=False)
        results = {}
        for mode in ("compiled", "strict", "fused"):
            torch._dynamo.reset()
            model = copy.deepcopy(base).to("pjrt")
            if mode == "compiled":
                model.forward = torch.compile(model.forward, backend="pjrt", dynamic=False)
            with torch_pjrt.eager_mode("strict" if mode == "compiled" else mode):
                results[mode] = tokens_per_s(model, "pjrt", args.new_tokens, args.repeats, static=mode == "compiled")
        equal = all(torch.equal(r[2].cpu(), cpu_out) for r in results.values())
        print(f"  {kind + ' 2x128':<22}{results['compiled'][0]:>10.0f}{results['strict'][0]:>10.0f}"
              f"{results['fused'][0]:>10.0f}{cpu_tps:>10.0f}{results['compiled'][0] / cpu_tps:>14.2f}"
              f"{results['compiled'][1]:>16}  {equal}")


if __name__ == "__main__":
    main()
