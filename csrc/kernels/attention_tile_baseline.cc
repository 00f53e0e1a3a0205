// attention_tile.inc for one instruction set (its -march is set in CMakeLists.txt).
#define TORCH_PJRT_ISA baseline
#define TORCH_PJRT_VECTOR_FLOATS 4
#include "kernels/attention_tile.inc"
