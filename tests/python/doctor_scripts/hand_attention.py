"""Attention written with matmul and softmax, not scaled_dot_product_attention."""
import torch

q = torch.randn(2, 4, 8, 16, device="cuda", requires_grad=True)
opt = torch.optim.SGD([q], lr=0.01)
for step in range(2):
    opt.zero_grad()
    scores = q @ q.transpose(-2, -1) / 4.0
    out = scores.softmax(dim=-1) @ q
    out.sum().backward()
    opt.step()
