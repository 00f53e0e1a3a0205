"""An op with no pjrt kernel inside the training step."""
import torch

w = torch.randn(6, 6, device="cuda", requires_grad=True)
opt = torch.optim.SGD([w], lr=0.01)
for step in range(3):
    opt.zero_grad()
    p = torch.special.airy_ai(w.detach())
    loss = (w * p).sum() ** 2
    loss.backward()
    opt.step()
