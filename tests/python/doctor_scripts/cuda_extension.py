"""A script that builds a custom CUDA kernel (never called here: the doctor reads it)."""
import torch


def build_fused_kernel():
    from torch.utils.cpp_extension import load_inline

    return load_inline(name="fused_gelu", cpp_sources="", cuda_sources="__global__ void k() {}")


x = torch.randn(8, 8, device="cuda")
print((x @ x).sum().item())
