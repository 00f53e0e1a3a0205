"""Kernels written in JAX, registered as PyTorch operators with torch_pjrt.library.

- ``rms_norm`` and ``softmax_cross_entropy``: plain JAX, replacing the PyTorch versions
  in a small transformer (``examples/transformer.py``'s RMSNorm and loss);
- ``pallas_add_scaled``: a Pallas kernel (a blocked elementwise ``x + alpha * y``). Pallas
  kernels run through Pallas' interpreter (interpret=True), which lowers to ordinary
  StableHLO: every PJRT plugin compiles it. On TPU or GPU with interpret=False, Pallas
  lowers to the chip's own kernel (Mosaic, Triton) inside the same StableHLO: that path
  needs the chip's plugin and was not run here.

Each function is one operator: on pjrt tensors its StableHLO joins the device graph
(strict, fused and compiled modes alike); on CPU tensors JAX runs it on the host;
gradients come from JAX's VJP.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from torch_pjrt.library import jax_op


@jax_op("torch_pjrt_examples::rms_norm")
def rms_norm(x, weight, eps: float = 1e-6):
    # Statistics in float32 at least, as PyTorch's RMSNorm computes them.
    acc = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(acc)
    scale = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * scale).astype(x.dtype) * weight


@jax_op("torch_pjrt_examples::softmax_cross_entropy")
def softmax_cross_entropy(logits, labels):
    """Mean cross-entropy of [N, C] logits against [N] integer labels."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]
    return -jnp.mean(picked)


def _add_scaled_block(x_ref, y_ref, o_ref, *, alpha):
    o_ref[...] = x_ref[...] + alpha * y_ref[...]


# JAX cannot differentiate a pallas_call (no transpose rule): forward only.
@jax_op("torch_pjrt_examples::pallas_add_scaled", differentiable=False)
def pallas_add_scaled(x, y, alpha: float = 1.0):
    """x + alpha * y for [N, 128k] inputs, in blocks of 8 x 128 (a grid of Pallas programs)."""
    block = (8, 128)
    grid = (x.shape[0] // block[0], x.shape[1] // block[1])
    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    return pl.pallas_call(
        lambda x_ref, y_ref, o_ref: _add_scaled_block(x_ref, y_ref, o_ref, alpha=alpha),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=grid, in_specs=[spec, spec], out_specs=spec,
        interpret=True,
    )(x, y)
