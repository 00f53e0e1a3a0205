// Kernels of ours that a host (CPU) plugin runs inside its programs: typed XLA FFI
// handlers, registered through the plugin's PJRT FFI extension and called by
// stablehlo.custom_call (api_version 4). A program reaches them only where the
// runtime registered them and a probe compile found them (executor::Executor::host_kernels).
// Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention_tile.h"
#include "kernels/few_row_product.h"

namespace torch_pjrt::kernels {

// torch_pjrt::paged_attention over the context each query row actually sees: operands
// query [S, Q, H, D] f32, kv_cache [2, N, KVH, B, D] f32, block_rows [S, M] and
// positions [S, Q] (s32 or s64); attributes scale (f64), sliding_window (i64),
// soft_cap (f64); result [S, Q, H, D] f32. Semantics: lowering/nn.h's paged_attention.
// The name carries the calling convention's version, so it is part of every program text and
// of the compile caches' keys: a cached executable of another convention is never loaded
// (bump it with any change to the operands, attributes or their meaning).
inline constexpr const char* kHostPagedAttention = "torch_pjrt_paged_attention_v1";

// y = x w for float32 matrices x [M, K] of at most kFewRowProductMaxRows rows (a decode step's
// tokens) and w [K, N], or w [N, K] where the attribute weight_transposed (i64) is 1 (a linear
// layer's weight as it lies); result [M, N] f32. The weights are read once, by the plugin's
// threads in panels of columns; XLA's own dot is faster from a few dozen rows on.
inline constexpr const char* kHostFewRowProduct = "torch_pjrt_few_row_product_v1";
inline constexpr int64_t kFewRowProductMaxRows = 16;
// Smaller weights stay in XLA's dot, fused with their neighbours: fanning a product out to the
// threads costs a few microseconds.
inline constexpr int64_t kFewRowProductMinWeights = int64_t{1} << 18;

// A handler (XLA_FFI_Handler*) and its custom-call target.
struct HostKernel {
  const char* target;
  void* handler;
};
// Every host kernel's handler; none where this build has no XLA FFI headers.
std::vector<HostKernel> host_kernel_handlers();

// The kernels' loops compiled for one instruction set.
struct HostKernelVariant {
  const char* name;  // "x86-64-v4", "x86-64-v3", "baseline"
  AttendTile attend;
  MultiplyPanels multiply;
};
// The variants this CPU runs, best first; none without host kernels.
std::vector<HostKernelVariant> host_kernel_variants();

// The instruction-set variant of the kernels' loops that runs ("x86-64-v4", "x86-64-v3",
// "baseline"; "" without host kernels): the best this CPU has, or the one
// TORCH_PJRT_HOST_KERNEL_ISA names where the CPU has it. host_kernel_isas: those it has, best first.
std::string host_kernel_isa();
std::vector<std::string> host_kernel_isas();

}  // namespace torch_pjrt::kernels
