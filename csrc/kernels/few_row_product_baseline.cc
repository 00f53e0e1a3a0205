// few_row_product.inc for one instruction set (its -march is set in CMakeLists.txt).
#define TORCH_PJRT_ISA baseline
#define TORCH_PJRT_VECTOR_FLOATS 4
#include "kernels/few_row_product.inc"
