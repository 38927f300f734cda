"""Hogwild style: torch.multiprocessing processes train a shared model; the parent only evaluates."""
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def dataset(seed, n):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))


def train(rank, model):
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    loader = DataLoader(dataset(rank, 64 * 100), batch_size=64, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    for _ in range(1):
        for data, target in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()


def test(model):
    loader = DataLoader(dataset(99, 64 * 16), batch_size=64)
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            correct += int((model(data).argmax(1) == target).sum())
    return correct


if __name__ == "__main__":
    import sys

    mp.set_start_method(sys.argv[1] if len(sys.argv) > 1 else "spawn", force=True)
    torch.manual_seed(1)
    model = Net()
    model.share_memory()
    processes = []
    for rank in range(2):
        p = mp.Process(target=train, args=(rank, model))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    print(f"exitcodes={[p.exitcode for p in processes]} correct={test(model)}")
