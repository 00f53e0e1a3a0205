"""A loss that turns into NaN: log of a negative number."""
import torch

w = torch.ones(4, device="cuda", requires_grad=True)
opt = torch.optim.SGD([w], lr=1.0)
for step in range(4):
    opt.zero_grad()
    h = w - 2.0 * step
    loss = torch.log(h).sum()
    loss.backward()
    opt.step()
