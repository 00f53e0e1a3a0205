// Kernels of ours that a host (CPU) plugin runs inside its programs: typed XLA FFI
// handlers, registered through the plugin's PJRT FFI extension and called by
// stablehlo.custom_call (api_version 4). A program reaches them only where the
// runtime registered them and a probe compile found them (executor::Executor::host_kernels).
// Torch-free.
#pragma once

#include <string>
#include <vector>

namespace torch_pjrt::kernels {

// torch_pjrt::paged_attention over the context each query row actually sees: operands
// query [S, Q, H, D] f32, kv_cache [2, N, KVH, B, D] f32, block_rows [S, M] and
// positions [S, Q] (s32 or s64); attributes scale (f64), sliding_window (i64),
// soft_cap (f64); result [S, Q, H, D] f32. Semantics: lowering/nn.h's paged_attention.
// The name carries the calling convention's version, so it is part of every program text and
// of the compile caches' keys: a cached executable of another convention is never loaded
// (bump it with any change to the operands, attributes or their meaning).
inline constexpr const char* kHostPagedAttention = "torch_pjrt_paged_attention_v1";

// The handlers (XLA_FFI_Handler*), or nullptr where this build has no XLA FFI headers.
void* host_paged_attention_handler();

// The instruction-set variant of the kernels' loops that runs ("x86-64-v4", "x86-64-v3",
// "baseline"; "" without host kernels): the best this CPU has, or the one
// TORCH_PJRT_HOST_KERNEL_ISA names where the CPU has it. host_kernel_isas: those it has, best first.
std::string host_kernel_isa();
std::vector<std::string> host_kernel_isas();

}  // namespace torch_pjrt::kernels
