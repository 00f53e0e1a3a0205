"""bf16 autocast inside a compiled function, and a GradScaler-scaled loss."""
import torch

layer = torch.nn.Linear(8, 8).cuda()
opt = torch.optim.SGD(layer.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cuda")


@torch.compile
def loss_of(x):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return layer(x).float().pow(2).mean()


for step in range(3):
    opt.zero_grad()
    loss = loss_of(torch.randn(4, 8, device="cuda"))
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
