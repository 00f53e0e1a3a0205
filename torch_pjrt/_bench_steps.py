"""Seeded training steps of the example models, for `python -m torch_pjrt.bench` and
benchmarks/bench_models.py (one definition of each step).

The models are the checkout's examples/models.py, which is not part of the package:
importing this module puts that folder on sys.path, so it works from a checkout
(the editable install) and raises ImportError elsewhere. `torch_pjrt.bench` itself
does not need it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F


def _examples_dir() -> str:
    path = Path(__file__).resolve().parent.parent / "examples"
    if not (path / "models.py").is_file():
        raise ImportError(f"torch_pjrt's benchmark models are the repository's examples/models.py, not found at "
                          f"{path}: run from a checkout")
    return str(path)


if _examples_dir() not in sys.path:
    sys.path.insert(0, _examples_dir())

from models import MLP, SmallCNN, TinyTransformer, synthetic_images, synthetic_tokens  # noqa: E402

Step = Callable[[], torch.Tensor]  # one training step; returns its loss


def training_step(loss: Callable[[], torch.Tensor], opt: torch.optim.Optimizer,
                  backend: str | None, compile_optimizer: bool = True) -> Step:
    """One step: zero_grad, loss().backward(), opt.step(). With a torch.compile backend,
    the loss (forward, and through AOTAutograd the backward) and the optimizer step
    are compiled; zero_grad and backward()'s call stay eager, as in user code. For
    pjrt, the optimizer is capturable (its step count on the device, as Dynamo does for
    CUDA by itself): a CPU step count would be read back from the device every step."""
    if backend == "pjrt":
        for group in opt.param_groups:
            if "capturable" in group:
                group["capturable"] = True
    forward = torch.compile(loss, backend=backend, dynamic=False) if backend else loss
    # Dynamo's precompile cache (TORCH_CACHING_PRECOMPILE=1) cannot package an optimizer step
    # (its parameters are static addresses) and torch 2.13 fails the compile if asked to:
    # the step is traced in every process, the loss comes from the cache.
    with torch._dynamo.config.patch(caching_precompile=False):
        update = torch.compile(opt.step, backend=backend, dynamic=False) if backend and compile_optimizer else opt.step

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = forward()
        loss.backward()
        update()
        return loss.detach()  # for a caller that logs it; the benchmark ignores it

    return step


def gpt_step(device: str, backend: str | None = None, autocast: bool = False, attention: str = "sdpa",
             tied: bool = False, fused_optimizer: bool = False) -> Step:
    """fused_optimizer: AdamW(fused=True), one op per step, not compiled (nothing for Dynamo to trace)."""
    vocab, seq = 256, 64
    torch.manual_seed(0)
    model = TinyTransformer(vocab=vocab, dim=128, heads=4, layers=4, seq=seq, attention=attention,
                            tied=tied).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused_optimizer or None)
    x, y = (t.to(device) for t in synthetic_tokens(8, seq, vocab))

    def loss() -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            return F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))

    return training_step(loss, opt, backend, compile_optimizer=not fused_optimizer)


def classifier_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                    y: torch.Tensor, backend: str | None) -> Step:
    return training_step(lambda: F.cross_entropy(model(x), y), opt, backend)


def cnn_step(device: str, backend: str | None = None) -> Step:
    torch.manual_seed(0)
    model = SmallCNN(width=32).to(device)
    x, y = (t.to(device) for t in synthetic_images(32, size=32))
    return classifier_step(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), x, y, backend)


def mlp_step(device: str, backend: str | None = None) -> Step:
    torch.manual_seed(0)
    model = MLP().to(device)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 32, generator=g).to(device), torch.randint(0, 10, (64,), generator=g).to(device)
    return classifier_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), x, y, backend)


def hf_gpt2_step(device: str, backend: str | None = None, fused_optimizer: bool = False) -> Step:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                                  attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused_optimizer or None)
    ids = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(1)).to(device)
    return training_step(lambda: model(input_ids=ids, labels=ids).loss, opt, backend,
                         compile_optimizer=not fused_optimizer)


# The CLI's --model choices: the step maker and the tokens one step trains on (None: not a language model).
MODELS: dict[str, tuple[Callable[[str, str | None], Step], int | None]] = {
    "gpt": (gpt_step, 8 * 64),
    "mlp": (mlp_step, None),
    "cnn": (cnn_step, None),
    "hf-gpt2": (hf_gpt2_step, 8 * 64),
}
