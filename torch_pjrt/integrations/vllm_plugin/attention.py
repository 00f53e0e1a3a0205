"""Paged attention for vLLM on pjrt, from ops that run natively on the device.

KV cache, per layer: ``[2, num_blocks, num_kv_heads, block_size, head_size]`` (keys,
values; a block's slots of one head together, so attention gathers them with the head
ahead of the slots). Each step the new tokens' keys and values are written at vLLM's slots
(block * block_size + offset, ``index_copy_``); each token then attends to the
positions up to its own (causal; a sliding window when the model has one) of its
request's blocks: ``torch_pjrt::paged_attention`` takes the tokens in tiles of up
to Q tokens of one request (Q from the bucket: 1 when decodes dominate, up to 32
for prefill) and reads each tile's context once with a running softmax: on a CPU
plugin with float32, a host kernel walks each tile's own context, as far as its rows
see; elsewhere a loop inside the program reads chunks of whole blocks, as many as the
step's longest context needs. Prefill, chunked prefill and decode are
the same computation, and the shapes depend only on the padded token count: one
program per bucket. Padding tokens sit at position 0 and write into block 0, vLLM's
null block, which no request owns.

Cost: the host kernel's work grows with each tile's own context; the program's loop
reads as many chunks per tile as the step's longest context (rounded up to a chunk).
Neither grows with ``max_model_len``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import torch

import torch_pjrt
from vllm.config import VllmConfig
from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionImpl, AttentionLayer,
                                       AttentionMetadataBuilder, AttentionType, CommonAttentionMetadata, MultipleOf)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
from vllm.v1.kv_cache_interface import AttentionSpec

from .buckets import Buckets


# Context positions each token reads per iteration of the program's attention loop (not the
# CPU plugin's host kernel, which walks 64 at a time): larger chunks mean
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
        return (2, num_blocks, num_kv_heads, block_size, head_size)

    @staticmethod
    def use_cascade_attention(*args: object, **kwargs: object) -> bool:
        return False


@dataclasses.dataclass
class PjrtAttentionMetadata:
    """A step's attention inputs, on the device. Attention works on tiles: up to Q query tokens of
    one request each (Buckets.tile_rows), so a prefill's context is read once per tile, not per token."""
    num_actual_tokens: int
    num_requests: int
    slot_mapping: torch.Tensor  # [padded tokens]: each token's KV cache slot
    tile_tokens: torch.Tensor  # [tiles, Q]: the token of each tile row (0 for a padding row)
    tile_positions: torch.Tensor  # [tiles, Q]: each row's position (-1: padding)
    tile_blocks: torch.Tensor  # [tiles, blocks per request]: each tile's request's blocks
    token_rows: torch.Tensor  # [padded tokens]: each token's row in the tiles, flattened
    last_tokens: torch.Tensor  # [padded requests]: each request's last token (its logits row)

    def tensors(self) -> list[torch.Tensor]:
        return [self.slot_mapping, self.tile_tokens, self.tile_positions, self.tile_blocks, self.token_rows,
                self.last_tokens]


def padding_metadata(tokens: int, requests: int, blocks_per_request: int,
                     device: torch.device) -> PjrtAttentionMetadata:
    """Metadata of a step of padding only (all in the null block): the same shapes,
    hence the same program, as a real step of that bucket."""
    tiles, rows = Buckets.tiles(tokens, requests), Buckets.tile_rows(tokens, requests)
    zeros = torch.zeros(tokens, dtype=torch.int64)
    return PjrtAttentionMetadata(
        0, 0, zeros.to(device), torch.zeros(tiles, rows, dtype=torch.int64).to(device),
        torch.full((tiles, rows), -1, dtype=torch.int64).to(device),
        torch.zeros(tiles, blocks_per_request, dtype=torch.int64).to(device), zeros.to(device),
        torch.zeros(requests, dtype=torch.int64).to(device))


class PjrtAttentionMetadataBuilder(AttentionMetadataBuilder[PjrtAttentionMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config: VllmConfig,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.buckets = buckets_of(vllm_config)
        self.target = torch_pjrt.device()

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> PjrtAttentionMetadata:
        # In NumPy on the host: a step's metadata is a few dozen operations on arrays of a few
        # hundred elements, where a torch op's dispatch (about 5 us) would be most of the cost.
        m = common_attn_metadata
        num_tokens, num_reqs = m.num_actual_tokens, m.num_reqs
        padded, padded_reqs = self.buckets.tokens_for(num_tokens), self.buckets.requests_for(num_reqs)
        starts = m.query_start_loc_cpu[:num_reqs + 1].numpy().astype(np.int64)
        query_lens = starts[1:] - starts[:-1]
        request_of_token = np.repeat(np.arange(num_reqs), query_lens)
        seq_lens = m.seq_lens[:num_reqs].cpu().numpy().astype(np.int64)
        # A token's position: its request's context before this step, plus its place in the query.
        positions = (seq_lens - query_lens)[request_of_token] + (np.arange(num_tokens) - starts[request_of_token])
        blocks = m.block_table_tensor[:num_reqs].cpu().numpy()

        # Each request's tokens in tiles of `rows`, in order.
        rows, tiles = Buckets.tile_rows(padded, padded_reqs), Buckets.tiles(padded, padded_reqs)
        tile_tokens = np.zeros((tiles, rows), dtype=np.int64)
        tile_positions = np.full((tiles, rows), -1, dtype=np.int64)
        tile_blocks = np.zeros((tiles, blocks.shape[1]), dtype=np.int64)
        token_rows = np.zeros(padded, dtype=np.int64)
        if rows == 1:  # a tile per token (the decode buckets): token i is tile i
            tokens = np.arange(num_tokens)
            tile_tokens[:num_tokens, 0] = tokens
            tile_positions[:num_tokens, 0] = positions
            tile_blocks[:num_tokens] = blocks[request_of_token]
            token_rows[:num_tokens] = tokens
        else:
            tiles_of_request = (query_lens + rows - 1) // rows
            used = int(tiles_of_request.sum())
            tile_request = np.repeat(np.arange(num_reqs), tiles_of_request)
            first_tile = np.cumsum(tiles_of_request) - tiles_of_request
            row_token = (starts[tile_request] + (np.arange(used) - first_tile[tile_request]) * rows)[:, None] \
                + np.arange(rows)
            real = row_token < starts[tile_request + 1][:, None]
            tile_tokens[:used] = np.where(real, row_token, 0)
            tile_positions[:used] = np.where(real, positions[np.minimum(row_token, num_tokens - 1)], -1)
            tile_blocks[:used] = blocks[tile_request]
            token_rows[row_token[real]] = (np.arange(used)[:, None] * rows + np.arange(rows))[real]

        slot = np.zeros(padded, dtype=np.int64)
        slot[:num_tokens] = np.maximum(m.slot_mapping[:num_tokens].cpu().numpy(), 0)
        last = np.zeros(padded_reqs, dtype=np.int64)
        last[:num_reqs] = starts[1:] - 1
        return PjrtAttentionMetadata(num_tokens, num_reqs, *(torch.from_numpy(t).to(self.target) for t in (
            slot, tile_tokens, tile_positions, tile_blocks, token_rows, last)))


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
        blocks, block_size = kv_cache.shape[1], kv_cache.shape[3]
        tokens = query.shape[0]
        # The step's keys and values in one write into the whole cache (writing a half, a view,
        # would copy it): the key for head h goes to row (0, block, h, offset) of the cache's
        # rows of head_size, the value to row (1, block, h, offset).
        heads = torch.arange(self.num_kv_heads, device=query.device)
        key_rows = ((m.slot_mapping // block_size * self.num_kv_heads).unsqueeze(1) + heads) * block_size \
            + (m.slot_mapping % block_size).unsqueeze(1)
        key_rows = key_rows.reshape(-1)
        half = blocks * self.num_kv_heads * block_size
        updates = torch.cat([key.reshape(-1, self.head_size), value.reshape(-1, self.head_size)]).to(kv_cache.dtype)
        kv_cache.view(2 * half, self.head_size).index_copy_(0, torch.cat([key_rows, key_rows + half]), updates)

        # The tokens in tiles; each tile reads its request's blocks in position order, chunk by
        # chunk, as far as the step's longest context goes (torch_pjrt::paged_attention).
        tiles, rows = m.tile_tokens.shape
        q = query.view(tokens, self.num_heads, self.head_size).index_select(0, m.tile_tokens.reshape(-1))
        out = torch.ops.torch_pjrt.paged_attention(
            q.view(tiles, rows, self.num_heads, self.head_size), kv_cache, m.tile_blocks, m.tile_positions, self.scale,
            sliding_window=self.sliding_window or 0, soft_cap=self.logits_soft_cap or 0.0,
            chunk_blocks=max(1, CHUNK_SLOTS // block_size))
        out = out.view(tiles * rows, self.num_heads, self.head_size).index_select(0, m.token_rows)
        output.copy_(out.reshape(output.shape).to(output.dtype))
        return output
