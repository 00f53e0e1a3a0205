"""vLLM worker and model runner on pjrt.

The runner is vLLM's CPU model runner (vLLM's GPU runner without CUDA streams,
graphs or events): its bookkeeping (input batch, block tables, slot mapping,
sampling) stays on the host. The model's weights, the KV cache and attention live
on the pjrt device. Each forward is padded to a token bucket and each logits
computation to a request bucket (buckets.py) and recorded in fused mode, so it
runs as one program per bucket; every bucket is compiled at start-up, so serving
compiles nothing new (``torch_pjrt.metrics()["compiles"]`` stays put).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

import torch_pjrt
from torch_pjrt._capture import CompiledGraph, capture, layout_key
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.forward_context import get_forward_context, set_forward_context
from vllm.logger import init_logger
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.utils import bind_kv_cache
from vllm.v1.worker.worker_base import CompilationTimes

from .attention import PjrtAttentionBackend, PjrtAttentionMetadata, buckets_of, padding_metadata

_log = init_logger("vllm.platforms.pjrt")


@contextlib.contextmanager
def _one_program() -> Iterator[None]:
    """Records the block in fused mode as one graph: no cut where an op recurs (a
    layer's first op recurring in the next layer would cut the forward at a place
    that depends on what ran before) and no size cut. The block ends in a sync."""
    policy = torch_pjrt.fusion_policy()
    torch_pjrt.set_fusion_policy(detect_loops=False, max_ops=1 << 30)
    try:
        with torch_pjrt.eager_mode("fused"):
            yield
    finally:
        torch_pjrt.set_fusion_policy(detect_loops=bool(policy["detect_loops"]), max_ops=int(policy["max_ops"]))


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    pad = t.new_zeros((rows - t.shape[0], *t.shape[1:]))
    return torch.cat([t, pad])


def _padded_int64(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A host integer vector as int64, zero-padded to `rows` (in NumPy: torch ops on a few
    dozen elements cost more in dispatch than in work)."""
    padded = np.zeros(rows, dtype=np.int64)
    padded[:t.shape[0]] = t.numpy()
    return torch.from_numpy(padded)


def _store_linear_weights_transposed(model: torch.nn.Module) -> None:
    """Each linear layer's weight [out, in] becomes a view of storage laid out [in, out], same
    values. A step's program then multiplies by that storage as it lies: stored [out, in], XLA's
    CPU dot transposes every weight at every step, which doubles a decode step's reads of the
    weights (a 16-token 512x512 layer: 0.24 ms, 0.13 ms this way). Loaders that copy new weights
    into the parameters still can (a copy into a view)."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, LinearBase) and isinstance(weight, torch.nn.Parameter) and weight.dim() == 2 \
                and isinstance(getattr(module, "quant_method", None), UnquantizedLinearMethod):
            weight.data = weight.data.t().contiguous().t()


class PjrtModelRunner(CPUModelRunner):
    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        # The CPU runner turns torch.accelerator's synchronize and empty_cache into no-ops for
        # the whole process; here the accelerator is pjrt, and they must keep working.
        synchronize, empty_cache = torch.accelerator.synchronize, torch.accelerator.empty_cache
        super().__init__(vllm_config, torch.device("cpu"))
        torch.accelerator.synchronize, torch.accelerator.empty_cache = synchronize, empty_cache
        self.target = device
        self.buckets = buckets_of(vllm_config)

    # --- model -------------------------------------------------------------
    def load_model(self, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights)
        self.model.to(self.target)
        _store_linear_weights_transposed(self.model)
        device_logits = self.model.compute_logits
        self._device_logits = device_logits

        def compute_logits(hidden_states: torch.Tensor) -> torch.Tensor:
            rows = hidden_states.shape[0]
            ready = self._step_logits
            self._step_logits = None
            if ready is not None:
                if ready.shape[0] != rows:
                    raise RuntimeError(f"vLLM on pjrt: the runner asked for {rows} rows of logits, the step "
                                       f"computed {ready.shape[0]} (one per request)")
                return ready
            # Hidden states the runner sliced itself (prompt logprobs): as many rows as tokens.
            bucket = self.buckets.requests_for(rows) if rows <= self.buckets.requests[-1] else \
                self.buckets.tokens_for(rows)
            padded = _pad_rows(hidden_states, bucket).to(self.target)
            with _one_program():
                return device_logits(padded).cpu()[:rows]

        # The runner calls it on the forward's host hidden states, sliced at each request's
        # last token: in the usual step those logits were computed in the forward's program.
        self.model.compute_logits = compute_logits
        self._step_logits: torch.Tensor | None = None
        self._weights = [t for t in (*self.model.parameters(), *self.model.buffers()) if t.device == self.target]
        self._programs: dict[int, CompiledGraph | str] = {}  # layout key -> replayable program, or why it is not

    def _model_forward(self, input_ids: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                       intermediate_tensors: Any = None, inputs_embeds: torch.Tensor | None = None,
                       **model_kwargs: Any) -> Any:
        """One program per step: the forward and the logits at each request's last token.
        Returns host hidden states of the real tokens: real ones when the runner needs
        them (prompt logprobs), else a placeholder it only slices for compute_logits,
        which then returns the logits this program computed."""
        if inputs_embeds is not None or intermediate_tensors is not None or model_kwargs:
            raise NotImplementedError("vLLM on pjrt: only token-id inputs are supported "
                                      "(no input embeddings, pipeline stages or multimodal inputs)")
        tokens = input_ids.shape[0]
        padded = self.buckets.tokens_for(tokens)
        # int64 on the host, whatever the runner's buffers hold: the program must not
        # depend on where the inputs came from (precompiled padding, or a real batch).
        ids = _padded_int64(input_ids, padded).to(self.target)
        pos = _padded_int64(positions, padded).to(self.target)
        metadata = next(iter(get_forward_context().attn_metadata.values()))
        if self.is_pooling_model or self.num_prompt_logprobs:
            with _one_program():
                return self.model(input_ids=ids, positions=pos).cpu()[:tokens]
        self._step_logits = self._step(ids, pos, metadata).cpu()[:metadata.num_requests]
        return torch.empty(tokens, self.model_config.get_hidden_size(), dtype=self.model_config.dtype)

    def _record_step(self, ids: torch.Tensor, pos: torch.Tensor, metadata: PjrtAttentionMetadata) -> torch.Tensor:
        hidden = self.model(input_ids=ids, positions=pos)
        return self._device_logits(hidden.index_select(0, metadata.last_tokens))

    def _step(self, ids: torch.Tensor, pos: torch.Tensor, metadata: PjrtAttentionMetadata) -> torch.Tensor:
        """The step's logits. Each bucket's first step is recorded as one program (a capture,
        as torch.compile's graphs are); later steps replay it on their inputs, with no
        Python in between: no model code, no op dispatch. Should a capture fail (the
        model reads a device tensor that is neither an input nor a weight), that bucket
        is recorded in fused mode at every step instead, still as one program."""
        inputs = [ids, pos, *metadata.tensors(), *self._kv_list]
        key = layout_key(inputs)
        program = self._programs.get(key)
        if isinstance(program, CompiledGraph):
            out = program.run(inputs)
            if out is not None:
                return out[0]
        if isinstance(program, str):
            with _one_program():
                return self._record_step(ids, pos, metadata)
        logits, graph, why = capture(self.target.index or 0, lambda: self._record_step(ids, pos, metadata), inputs,
                                     lambda logits: [logits], self._weights)
        self._programs[key] = graph if graph is not None else why
        if graph is None:
            _log.warning("vLLM on pjrt: a step of %d tokens is recorded op by op at every step (into one "
                         "program) because it cannot be replayed: %s", ids.shape[0], why)
        return logits

    # --- KV cache ------------------------------------------------------------
    def initialize_kv_cache_tensors(self, kv_cache_config: KVCacheConfig, kernel_block_sizes: list[int],
                                    kv_cache_allocation_context: AbstractContextManager | None = None,
                                    ) -> dict[str, torch.Tensor]:
        kv_caches: dict[str, torch.Tensor] = {}
        for group in kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            if not isinstance(spec, AttentionSpec):
                raise NotImplementedError(f"vLLM on pjrt: KV cache kind {type(spec).__name__} is not supported")
        # One tensor per layer in this backend's own layout (attention.py), not views into
        # vLLM's shared byte buffer: the attention code is the only reader.
        num_blocks = kv_cache_config.num_blocks
        for tensor in kv_cache_config.kv_cache_tensors:
            for layer in tensor.layers:
                group = next(g for g in kv_cache_config.kv_cache_groups if layer in g.layer_names)
                spec = group.kv_cache_spec
                shape = PjrtAttentionBackend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads,
                                                                spec.head_size)
                kv_caches[layer] = torch.zeros(shape, dtype=spec.dtype, device=self.target)
        for layer, target_layer in self.shared_kv_cache_layers.items():
            kv_caches[layer] = kv_caches[target_layer]
        bind_kv_cache(kv_caches, self.compilation_config.static_forward_context, self.kv_caches, 1,
                      kv_cache_groups=kv_cache_config.kv_cache_groups)
        self._kv_list = list({id(t): t for t in kv_caches.values()}.values())
        return kv_caches

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        # Attention masks every slot past a token's position, and a cache only ever holds
        # finite values (zeros, then written keys/values), so reused blocks need no clearing.
        pass

    # --- start-up compilation ---------------------------------------------------
    @torch.no_grad()
    def precompile(self) -> None:
        """Runs every bucket once, so that each program is compiled before serving: a step
        of each (tokens, requests) bucket on padding-only inputs (they write into the null
        block)."""
        start = time.perf_counter()
        compiles = torch_pjrt.metrics()["compiles"]
        layers = [name for group in self.kv_cache_config.kv_cache_groups for name in group.layer_names]
        table = self.input_batch.block_table.block_tables[0]
        for tokens, requests in self.buckets.forward_shapes():
            metadata = padding_metadata(tokens, requests, table.max_num_blocks_per_req, self.target)
            with set_forward_context({name: metadata for name in layers}, self.vllm_config, num_tokens=tokens):
                self._model_forward(input_ids=torch.zeros(tokens, dtype=torch.int64),
                                    positions=torch.zeros(tokens, dtype=torch.int64))
            self._step_logits = None
        _log.info("vLLM on pjrt: programs for %d (tokens, requests) buckets ready in %.1f s (%d compiled, the "
                  "others from the program cache): tokens %s, requests %s", len(self.buckets.forward_shapes()),
                  time.perf_counter() - start, torch_pjrt.metrics()["compiles"] - compiles, self.buckets.tokens,
                  self.buckets.requests)


class PjrtWorker(Worker):
    def init_device(self) -> None:
        self.device = torch_pjrt.device()
        # Host-side torch work here is bookkeeping on small tensors. With more threads,
        # OpenMP's spinning workers take the cores the device (the XLA CPU plugin's own
        # thread pool) needs: a trivial program's round trip went from 0.4 to 2.5 ms.
        torch.set_num_threads(1)
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        self.model_runner = PjrtModelRunner(self.vllm_config, self.device)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        with set_current_vllm_config(self.vllm_config):
            self.model_runner.load_model(load_dummy_weights=load_dummy_weights)

    def determine_available_memory(self) -> int:
        """KV cache bytes: ``kv_cache_memory_bytes`` when given; else the device's memory
        times ``gpu_memory_utilization`` less what is allocated, capped at what
        ``max_num_seqs`` sequences of ``max_model_len`` tokens can use (on a CPU plugin the
        device memory is the host's, which the cap keeps from being claimed whole)."""
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit:
            return int(explicit)
        module = getattr(torch, self.device.type)
        free, total = module.mem_get_info(self.device.index or 0)
        budget = int(total * self.cache_config.gpu_memory_utilization) - module.memory_allocated(self.device)
        budget = min(budget, free)
        per_token = sum(spec.page_size_bytes // spec.block_size
                        for spec in self.model_runner.get_kv_cache_spec().values())
        needed = per_token * (self.scheduler_config.max_num_seqs * self.model_config.max_model_len
                              + 2 * self.cache_config.block_size)
        if budget <= 0:
            raise RuntimeError(f"vLLM on pjrt: no device memory left for the KV cache ({free} of {total} bytes "
                               "free); lower the model size or raise gpu_memory_utilization")
        return min(budget, needed)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        self.model_runner.precompile()
        set_random_seed(self.model_config.seed)
        return CompilationTimes(language_model=self.compilation_config.compilation_time,
                                encoder=self.compilation_config.encoder_compilation_time)

    def _maybe_get_memory_pool_context(self, tag: str) -> AbstractContextManager:
        return contextlib.nullcontext()  # vLLM's sleep-mode memory pool is CUDA's

    def sleep(self, level: int = 1) -> None:
        _log.warning("vLLM on pjrt: sleep mode is not supported; ignored")

    def wake_up(self, tags: list[str] | None = None) -> None:
        _log.warning("vLLM on pjrt: sleep mode is not supported; ignored")
