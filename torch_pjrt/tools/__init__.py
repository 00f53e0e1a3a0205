"""Developer tools for torch_pjrt (not imported by ``import torch_pjrt``)."""
