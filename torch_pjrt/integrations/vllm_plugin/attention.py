"""Paged attention for vLLM on pjrt, from ops that run natively on the device.

KV cache, per layer: ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (keys,
values). Each step the new tokens' keys and values are written at vLLM's slots
(block * block_size + offset, ``index_copy_``); each token then attends to the
positions up to its own (causal; a sliding window when the model has one) of its
request's blocks: ``torch_pjrt::paged_attention`` reads the context in chunks of
whole blocks with a running softmax, for as many chunks as the step's longest
context needs (a loop inside the program). Prefill, chunked prefill and decode are
the same computation, and the shapes depend only on the padded token count: one
program per bucket. Padding tokens sit at position 0 and write into block 0, vLLM's
null block, which no request owns.

Cost: every token reads as many chunks as the step's longest context, so work grows
with tokens x that context (rounded up to a chunk), not with ``max_model_len``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

import torch_pjrt
from vllm.config import VllmConfig
from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionImpl, AttentionLayer,
                                       AttentionMetadataBuilder, AttentionType, CommonAttentionMetadata, MultipleOf)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
from vllm.v1.kv_cache_interface import AttentionSpec

from .buckets import Buckets


# Context positions each token reads per iteration of the attention's loop: larger chunks mean
# fewer iterations, smaller ones less reading past the longest context.
CHUNK_SLOTS = 128


def buckets_of(vllm_config: VllmConfig) -> Buckets:
    scheduler = vllm_config.scheduler_config
    return Buckets.for_limits(scheduler.max_num_batched_tokens, scheduler.max_num_seqs)


@register_backend(AttentionBackendEnum.CUSTOM)  # vLLM's slot for an out-of-tree backend
class PjrtAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float32, torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        return [MultipleOf(1)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @staticmethod
    def get_impl_cls() -> type["PjrtAttentionImpl"]:
        return PjrtAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["PjrtAttentionMetadataBuilder"]:
        return PjrtAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def use_cascade_attention(*args: object, **kwargs: object) -> bool:
        return False


@dataclasses.dataclass
class PjrtAttentionMetadata:
    num_actual_tokens: int
    num_requests: int
    slot_mapping: torch.Tensor  # [padded tokens] int64, on the device
    block_rows: torch.Tensor  # [padded tokens, blocks per request] int64: each token's request's blocks
    positions: torch.Tensor  # [padded tokens] int64
    last_tokens: torch.Tensor  # [padded requests] int64: each request's last token (its logits row)


def padding_metadata(tokens: int, requests: int, blocks_per_request: int,
                     device: torch.device) -> PjrtAttentionMetadata:
    """Metadata of a step of padding only (all in the null block): the same shapes,
    hence the same program, as a real step of that bucket."""
    zeros = torch.zeros(tokens, dtype=torch.int64)
    rows = torch.zeros(tokens, blocks_per_request, dtype=torch.int64)
    last = torch.zeros(requests, dtype=torch.int64)
    return PjrtAttentionMetadata(0, 0, zeros.to(device), rows.to(device), zeros.to(device), last.to(device))


class PjrtAttentionMetadataBuilder(AttentionMetadataBuilder[PjrtAttentionMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config: VllmConfig,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.buckets = buckets_of(vllm_config)
        self.target = torch_pjrt.device()

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> PjrtAttentionMetadata:
        m = common_attn_metadata
        num_tokens, num_reqs = m.num_actual_tokens, m.num_reqs
        padded = self.buckets.tokens_for(num_tokens)
        starts = m.query_start_loc_cpu[:num_reqs + 1].to(torch.int64)
        query_lens = starts[1:] - starts[:-1]
        request_of_token = torch.repeat_interleave(torch.arange(num_reqs), query_lens)
        seq_lens = m.seq_lens[:num_reqs].cpu().to(torch.int64)
        # A token's position: its request's context before this step, plus its place in the query.
        positions = (seq_lens - query_lens)[request_of_token] + (torch.arange(num_tokens) - starts[request_of_token])
        blocks = m.block_table_tensor[:num_reqs].cpu().to(torch.int64)

        slot = torch.zeros(padded, dtype=torch.int64)
        slot[:num_tokens] = m.slot_mapping[:num_tokens].cpu().clamp_min(0)
        rows = torch.zeros(padded, blocks.shape[1], dtype=torch.int64)
        rows[:num_tokens] = blocks[request_of_token]
        pos = torch.zeros(padded, dtype=torch.int64)
        pos[:num_tokens] = positions
        last = torch.zeros(self.buckets.requests_for(num_reqs), dtype=torch.int64)
        last[:num_reqs] = starts[1:] - 1
        return PjrtAttentionMetadata(num_tokens, num_reqs, slot.to(self.target), rows.to(self.target),
                                     pos.to(self.target), last.to(self.target))


class PjrtAttentionImpl(AttentionImpl[PjrtAttentionMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None = None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None, sinks: torch.Tensor | None = None) -> None:
        unsupported = {"ALiBi slopes": alibi_slopes is not None, "attention sinks": sinks is not None,
                       f"attention type {attn_type!r}": attn_type != AttentionType.DECODER,
                       f"KV cache dtype {kv_cache_dtype!r}": kv_cache_dtype != "auto",
                       "KV cache sharing between layers": kv_sharing_target_layer_name is not None}
        missing = [what for what, used in unsupported.items() if used]
        if missing:
            raise NotImplementedError(f"vLLM on pjrt: attention does not support {', '.join(missing)}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name

    def forward(self, layer: AttentionLayer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: PjrtAttentionMetadata | None, output: torch.Tensor,
                output_scale: torch.Tensor | None = None, output_block_scale: torch.Tensor | None = None,
                ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("vLLM on pjrt: quantized attention output is not supported")
        if attn_metadata is None:  # profiling run without a KV cache
            return output.zero_()
        m = attn_metadata
        blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
        tokens = query.shape[0]
        keys, values = kv_cache[0], kv_cache[1]
        slots = (blocks * block_size, self.num_kv_heads, self.head_size)
        keys.view(slots).index_copy_(0, m.slot_mapping, key.to(keys.dtype))
        values.view(slots).index_copy_(0, m.slot_mapping, value.to(values.dtype))

        # Each token reads its request's blocks in position order, chunk by chunk, as far as
        # the batch's longest context goes (torch_pjrt::paged_attention).
        out = torch.ops.torch_pjrt.paged_attention(
            query.view(tokens, self.num_heads, self.head_size), keys, values, m.block_rows, m.positions, self.scale,
            sliding_window=self.sliding_window or 0, soft_cap=self.logits_soft_cap or 0.0,
            chunk_blocks=max(1, CHUNK_SLOTS // block_size))
        output.copy_(out.reshape(output.shape).to(output.dtype))
        return output
