"""A script that fails in the middle of training."""
import torch

w = torch.ones(4, device="cuda", requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for step in range(3):
    opt.zero_grad()
    loss = (w * 2).sum()
    loss.backward()
    opt.step()
    if step == 1:
        raise ValueError("the data loader ran dry")
