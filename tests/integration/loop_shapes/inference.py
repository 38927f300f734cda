"""Inference loop over tensors batched by hand: forward only, under no_grad() or inference_mode()."""
import sys
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)
mode = sys.argv[1] if len(sys.argv) > 1 else "no_grad"
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).eval()
softmax = nn.Softmax(dim=1)  # a root module without parameters: not the model
data = torch.randn(30 * 32, 64)
context = torch.no_grad if mode == "no_grad" else torch.inference_mode
correct = 0
with context():
    for i in range(0, len(data), 32):
        batch = data[i:i + 32]
        probs = softmax(model(batch))
        correct += int((probs.argmax(1) == 0).sum())
print(f"batches={len(data) // 32} correct={correct}")
