"""Planted bottleneck: none — a text model fed from a JSONL file by the stepscope.data toolkit.

The script writes a JSONL file of token sequences (16–160 tokens each) into a temporary directory
(deleted at the end) and reads it as a user of ``stepscope.data`` would:
``IndexedJsonl`` (random access through a line index built once and cached beside the file),
``BucketBatchSampler`` (batches of similar length from the cached per-sample token counts, shuffled
within and across buckets), ``pad_collate`` (padding to a multiple of 8, with the attention
mask) and ``SkipBadSamples``: one line in 64 holds an empty sample, which fails to load and is
replaced by the next one — counted, and shown in the summary as "Skipped samples". Each batch costs well under a millisecond to load and little padding, while the model (a
per-token MLP with masked mean pooling) does large matmuls: the step is compute-bound and the input
pipeline is not what holds it back. Compare ``stepscope demo input-cpu``.
"""

from __future__ import annotations

import os
import random
import tempfile
from functools import partial

import orjson
import torch
from torch.utils.data import DataLoader

from stepscope.data import BucketBatchSampler, IndexedJsonl, SkipBadSamples, pad_collate
from stepscope.zoo._common import parse_args, report

VOCAB = 1000
WIDTH = 192
HIDDEN = 768


#: Every BAD_EVERY-th sample of the corpus is empty (a broken record, as real corpora have).
BAD_EVERY = 64


def write_corpus(path: str, count: int, seed: int) -> None:
    """``count`` samples ``{"tokens": [...], "target": float}``; the target is learnable from the tokens."""
    rng = random.Random(seed)
    with open(path, "wb") as out:
        for index in range(count):
            tokens = [rng.randrange(VOCAB) for _ in range(rng.randint(16, 160))]
            target = sum(tokens) / len(tokens) / VOCAB
            if index % BAD_EVERY == BAD_EVERY - 1:
                tokens = []
            out.write(orjson.dumps({"tokens": tokens, "target": target}) + b"\n")


def to_tensors(sample: dict) -> dict:
    if not sample["tokens"]:
        raise ValueError("a sample without tokens")
    return {"tokens": torch.tensor(sample["tokens"]), "target": torch.tensor([sample["target"]])}


class PooledTokenMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, WIDTH))
        self.head = torch.nn.Linear(WIDTH, 1)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.mlp(self.embed(tokens)) * mask.unsqueeze(-1)
        return self.head(hidden.sum(dim=1) / mask.sum(dim=1, keepdim=True))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=40, batch_size=32)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix="stepscope-jsonl-") as directory:
        path = os.path.join(directory, "corpus.jsonl")
        write_corpus(path, args.steps * args.batch_size, args.seed)
        corpus = IndexedJsonl(path, transform=to_tensors)
        sizes = corpus.sizes(lambda sample: len(sample["tokens"]), size_key="tokens")
        dataset = SkipBadSamples(corpus, exceptions=ValueError, name="corpus.jsonl")
        batches = BucketBatchSampler(sizes, args.batch_size, num_buckets=6, seed=args.seed)
        loader = DataLoader(dataset, batch_sampler=batches, num_workers=args.num_workers or 0,
                            collate_fn=partial(pad_collate, pad_to_multiple_of=8, sequence_keys=["tokens"]))
        model = PooledTokenMLP()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        losses: list[float] = []
        epoch = 0
        while len(losses) < args.steps:
            batches.set_epoch(epoch)
            for batch in loader:
                optimizer.zero_grad(set_to_none=True)
                prediction = model(batch["tokens"], batch["attention_mask"].float())
                loss = torch.nn.functional.mse_loss(prediction, batch["target"])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                if len(losses) >= args.steps:
                    break
            epoch += 1
    report(losses)
    print(f"skipped_samples={dataset.skipped}")


if __name__ == "__main__":
    main()
