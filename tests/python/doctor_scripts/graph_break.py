"""A print inside a compiled function: a graph break."""
import torch

layer = torch.nn.Linear(8, 8).cuda()
opt = torch.optim.SGD(layer.parameters(), lr=0.01)


@torch.compile
def step_loss(x):
    h = layer(x).relu()
    print("inside the model")
    return h.pow(2).mean()


for step in range(3):
    opt.zero_grad()
    loss = step_loss(torch.randn(4, 8, device="cuda"))
    loss.backward()
    opt.step()
