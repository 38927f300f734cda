"""A training loop beside a pure-Python thread that holds the GIL in 3 ms slices (BENCHMARKS.md,
"A GIL-holding thread against py-spy"). ``--no-thread`` runs the same loop without it."""
import sys
import threading, time
import torch

def telemetry_loop(stop):
    counter = 0
    while not stop.is_set():
        end = time.perf_counter() + 0.003
        while time.perf_counter() < end:      # 3 ms of pure Python, holding the GIL
            counter += sum(i * i for i in range(50))
        time.sleep(0.004)

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [torch.randn(32, 64) for _ in range(16)]
stop = threading.Event()
thread = threading.Thread(target=telemetry_loop, args=(stop,), name="telemetry", daemon=True)
if "--no-thread" not in sys.argv:
    thread.start()
start = time.perf_counter()
step = 0
while time.perf_counter() - start < 8.0:
    x = data[step % 16]
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    step += 1
stop.set()
print("steps", step)
