// The paged-attention host kernel's inner work: one tile's query rows over one key/value head.
// Compiled once per instruction set (attention_tile_*.cc include attention_tile.inc with their
// own -march), because GCC turns comparisons of generic vectors into scalar code in functions
// cloned by target_clones; the handler picks the variant for the CPU it runs on. Torch-free
// and XLA-free.
#pragma once

#include <cstdint>

namespace torch_pjrt::kernels {

// An integer operand (s32 or s64), read element by element.
struct IntegerOperand {
  const void* data;
  bool wide;  // s64
  int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(data)[i] : static_cast<const int32_t*>(data)[i];
  }
};

struct TileWork {
  const float* q;  // [S, Q, H, D]
  const float* keys;  // [N, KVH, B, D]
  const float* values;
  float* out;  // [S, Q, H, D]
  IntegerOperand block_rows;  // [S, table]
  IntegerOperand positions;  // [S, Q]
  int64_t rows, heads, head_size, blocks, kv_heads, block_size, table, group;
  float scale, soft_cap;
  int64_t sliding_window;
};

using AttendTile = void (*)(const TileWork& work, int64_t tile, int64_t kv_head);

namespace x86_64_v4 {
void attend(const TileWork& work, int64_t tile, int64_t kv_head);
}
namespace x86_64_v3 {
void attend(const TileWork& work, int64_t tile, int64_t kv_head);
}
namespace baseline {
void attend(const TileWork& work, int64_t tile, int64_t kv_head);
}

// The variant for this CPU: AVX-512 (x86-64-v4), AVX2 with FMA (x86-64-v3), or SSE2.
AttendTile attend_for_this_cpu();

}  // namespace torch_pjrt::kernels
