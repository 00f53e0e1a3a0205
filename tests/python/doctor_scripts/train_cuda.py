"""A small CUDA training script: .cuda(), device="cuda", an .item() every step."""
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 8, device="cuda")
y = torch.randn(32, 4, device="cuda")
for step in range(6):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
