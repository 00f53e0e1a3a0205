"""Level 1 from the source: CUDA-specific lines and CUDA-only libraries in the
script and the modules it imported from its own directory."""

from __future__ import annotations

import ast
import os
import re
import sys

from .findings import Finding, Findings

# Libraries with no path off NVIDIA GPUs (or none without a rewrite).
CUDA_ONLY = {
    "flash_attn": "FlashAttention's CUDA kernels: use F.scaled_dot_product_attention",
    "xformers": "xformers' CUDA kernels: use F.scaled_dot_product_attention",
    "apex": "NVIDIA Apex: use torch.amp and torch.optim's fused=False optimizers",
    "bitsandbytes": "bitsandbytes' CUDA quantization kernels",
    "triton": "Triton kernels (GPU only)",
    "transformer_engine": "NVIDIA Transformer Engine",
    "cupy": "CuPy (CUDA arrays)",
    "pycuda": "PyCUDA",
    "mamba_ssm": "Mamba's CUDA kernels",
    "causal_conv1d": "causal-conv1d's CUDA kernels",
    "deepspeed": "DeepSpeed (CUDA/NCCL centred; its ZeRO maps to FSDP2)",
}
# Of those, the ones whose value is custom kernels: their route off CUDA is a kernel in JAX.
KERNEL_LIBRARIES = {"flash_attn", "xformers", "triton", "mamba_ssm", "causal_conv1d", "bitsandbytes",
                    "transformer_engine"}
KERNEL_ROUTE = ("write the kernel in JAX (Pallas for a tiled one) and register it with "
                "torch_pjrt.library.jax_op('namespace::name'): the operator then runs on every PJRT plugin, "
                "inside pjrt's fused and compiled programs, with autograd from JAX (README, \"Custom kernels\")")
_LINE_PATTERNS = [
    (re.compile(r"\.cuda\s*\("), "cuda_source", ".cuda() call"),
    (re.compile(r"""["']cuda(:\d+)?["']"""), "cuda_source", "'cuda' device string"),
    (re.compile(r"\btorch\.cuda\.\w+"), "cuda_source", "torch.cuda API"),
    (re.compile(r"""["'][^"']*nccl[^"']*["']"""), "nccl", "NCCL named"),
    (re.compile(r"\bCUDAExtension\b|\bload_inline\s*\(|cpp_extension\.load\s*\("), "cuda_extension",
     "custom C++/CUDA extension build"),
]


def _imports(tree: ast.AST) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module.split(".")[0], node.lineno))
    return found


def scan_file(path: str, findings: Findings) -> None:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        tree = ast.parse(text, filename=path)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        code = line.split("#", 1)[0]
        for pattern, kind, what in _LINE_PATTERNS:
            if pattern.search(code):
                severity = "fail" if kind == "cuda_extension" else "warn"
                findings.add(Finding(1, kind, f"{what} in the source: {line.strip()[:120]}", path, lineno,
                                     severity=severity))
                if kind == "cuda_extension":
                    findings.add(Finding(2, "custom_kernel_route", f"a C++/CUDA extension: {KERNEL_ROUTE}", path, lineno,
                                         severity="info"))
    for module, lineno in _imports(tree):
        if module in CUDA_ONLY:
            findings.add(Finding(1, "cuda_only_library", f"imports {module}: {CUDA_ONLY[module]}", path, lineno,
                                 severity="fail"))
            if module in KERNEL_LIBRARIES:
                findings.add(Finding(2, "custom_kernel_route", f"{module}'s kernels: {KERNEL_ROUTE}", path, lineno,
                                     severity="info"))


def local_sources(script: str) -> list[str]:
    """The script, and every module it loaded from its own directory tree."""
    root = os.path.dirname(os.path.abspath(script)) + os.sep
    paths = {os.path.abspath(script)}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if path.endswith(".py") and os.path.abspath(path).startswith(root) and "site-packages" not in path:
            paths.add(os.path.abspath(path))
    return sorted(paths)
