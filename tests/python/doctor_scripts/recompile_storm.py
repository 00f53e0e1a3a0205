"""A compiled function fed a new sequence length every step."""
import torch

layer = torch.nn.Linear(16, 16).cuda()
opt = torch.optim.SGD(layer.parameters(), lr=0.01)
fn = torch.compile(lambda x: layer(x).relu().mean(), dynamic=False)
for step, length in enumerate([5, 7, 9, 11, 13, 15, 17]):
    opt.zero_grad()
    loss = fn(torch.randn(2, length, 16, device="cuda"))
    loss.backward()
    opt.step()
