// few_row_product.inc for one instruction set (its -march is set in CMakeLists.txt).
#define TORCH_PJRT_ISA x86_64_v4
#define TORCH_PJRT_VECTOR_FLOATS 16
#include "kernels/few_row_product.inc"
