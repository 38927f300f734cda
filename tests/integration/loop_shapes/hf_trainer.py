"""Hugging Face Trainer on a tiny GPT-2 built from a config, fed by DataCollatorForLanguageModeling."""
import os
import sys

import torch
from transformers import (DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast,
                          Trainer, TrainingArguments)
from tokenizers import Tokenizer, models, pre_tokenizers

torch.manual_seed(0)
torch.set_num_threads(1)
vocab = {f"w{i}": i for i in range(98)}
vocab.update({"[PAD]": 98, "[UNK]": 99})
raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
raw.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]")
examples = [tokenizer(" ".join(f"w{(i * 7 + j) % 98}" for j in range(16))) for i in range(8 * 24)]
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=100, n_positions=32))
collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)
args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=8, num_train_epochs=1,
                         report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                         dataloader_num_workers=0, disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=examples, data_collator=collator).train()
print("done")
