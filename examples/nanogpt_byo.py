"""A nanoGPT-style training loop measured with `pretok_lib.measure.Run` (docs/BYO.md): tokens/s, effective tokens/s,
padding and data stall land in OUT as a pretok run directory; `pretok report` shows it beside other runs.

    python examples/nanogpt_byo.py runs/nanogpt [--data train.bin --vocab 50304] [--steps 20]
"""
import argparse

import numpy as np
import torch

from pretok_lib.measure import Run

p = argparse.ArgumentParser()
p.add_argument("out"), p.add_argument("--data", help="uint16 token file (nanoGPT's train.bin); default: random tokens")
p.add_argument("--vocab", type=int, default=256), p.add_argument("--steps", type=int, default=20)
p.add_argument("--batch", type=int, default=8), p.add_argument("--block", type=int, default=64)
a = p.parse_args()
data = np.memmap(a.data, dtype=np.uint16, mode="r") if a.data else \
    np.random.default_rng(0).integers(0, a.vocab, 200_000).astype(np.uint16)


def get_batch():  # nanoGPT's: random windows, y = x shifted by one token
    while True:
        ix = np.random.randint(0, len(data) - a.block - 1, a.batch)
        x = torch.from_numpy(np.stack([data[i:i + a.block] for i in ix]).astype(np.int64))
        yield x, torch.from_numpy(np.stack([data[i + 1:i + 1 + a.block] for i in ix]).astype(np.int64))


model = torch.nn.Sequential(torch.nn.Embedding(a.vocab, 64), torch.nn.Linear(64, a.vocab))  # your GPT here
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
config = {"model": {"n_embd": 64, "vocab_size": a.vocab},
          "train": {"lr": 1e-3, "micro_batch": a.batch, "steps": a.steps}}
with Run(a.out, config, seq_len=a.block, data_kind="nanogpt-get-batch") as m:
    for it, (x, y) in enumerate(m.batches(get_batch())):  # times each fetch: the data wait
        loss = torch.nn.functional.cross_entropy(model(x).view(-1, a.vocab), y.view(-1), ignore_index=-1)
        opt.zero_grad(set_to_none=True), loss.backward(), opt.step()
        m.step(loss=loss.item(), lr=1e-3)  # one record per optimizer step
        if it + 1 == a.steps:
            break
    with m.paused(), torch.no_grad():  # evaluation time counts in no step
        x, y = next(get_batch())
        m.eval(torch.nn.functional.cross_entropy(model(x).view(-1, a.vocab), y.view(-1)).item())
print(f"measured {m.steps} steps into {a.out}")
