"""Word-language-model style: manual SGD over a corpus batched by hand (no torch.optim, no DataLoader)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)
VOCAB, BSZ, BPTT, LR = 200, 20, 35, 20.0
corpus = torch.randint(0, VOCAB, (BSZ * BPTT * 21,))


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, 32)
        self.rnn = nn.LSTM(32, 32)
        self.decoder = nn.Linear(32, VOCAB)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out).view(-1, VOCAB), hidden


train_data = batchify(corpus, BSZ)
model, criterion = RNNModel(), nn.CrossEntropyLoss()


def get_batch(source, i):
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


steps = 0
for epoch in range(1):
    model.train()
    hidden = (torch.zeros(1, BSZ, 32), torch.zeros(1, BSZ, 32))
    for i in range(0, train_data.size(0) - 1, BPTT):
        data, targets = get_batch(train_data, i)
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-LR)
        steps += 1
    model.eval()
    with torch.no_grad():
        for i in range(0, 5 * BPTT, BPTT):
            data, targets = get_batch(train_data, i)
            output, hidden = model(data, hidden)
print(f"steps={steps}")
