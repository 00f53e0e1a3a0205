// The few-row product host kernel's loops: y = x w for an x of a few rows (a decode step's
// tokens), where the work is reading w once. Compiled once per instruction set like the
// attention tile (few_row_product_*.cc include few_row_product.inc with their own -march);
// host_kernels.cc picks the variant for the CPU it runs on. Torch-free and XLA-free.
#pragma once

#include <cstdint>

namespace torch_pjrt::kernels {

struct ProductWork {
  const float* x;  // [rows, depth]
  const float* w;  // [depth, columns], or [columns, depth] where weight_transposed
  float* y;  // [rows, columns]
  int64_t rows, depth, columns;
  bool weight_transposed;
};

// Output columns per work item: a panel's weights are read once, by one thread.
inline constexpr int64_t kProductPanelColumns = 64;

// y[:, panel columns] for the panels [first_panel, end_panel) of kProductPanelColumns columns
// (the last one may be narrower).
using MultiplyPanels = void (*)(const ProductWork& work, int64_t first_panel, int64_t end_panel);

namespace x86_64_v4 {
void multiply_panels(const ProductWork& work, int64_t first_panel, int64_t end_panel);
}
namespace x86_64_v3 {
void multiply_panels(const ProductWork& work, int64_t first_panel, int64_t end_panel);
}
namespace baseline {
void multiply_panels(const ProductWork& work, int64_t first_panel, int64_t end_panel);
}

// The variant for this CPU (the one attend_for_this_cpu runs).
MultiplyPanels multiply_panels_for_this_cpu();

}  // namespace torch_pjrt::kernels
