"""A tiny model trained through Accelerate (prepared model, optimizer and DataLoader)."""
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
accelerator = Accelerator(cpu=True)
data = TensorDataset(torch.randn(32 * 20, 16), torch.randn(32 * 20, 1))
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=32, shuffle=True))
steps = 0
for x, y in loader:
    optimizer.zero_grad()
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    steps += 1
print(f"steps={steps}")
