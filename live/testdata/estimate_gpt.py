"""A small GPT trained with AdamW, for the estimate's tests: the model of
shared/testdata/pytorch-2.11/record.py with its attention written out (no
scaled_dot_product_attention before PyTorch 2.0), on cuda unless --device
says otherwise.

python estimate_gpt.py [--batch 4] [--seq 64] [--layers 2] [--d 64] [--steps 3] [--device cuda] [--amp]
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q = q.view(B, T, self.h, D // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, D // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, D // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // self.h))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, h, layers, T):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(T, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.lnf(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    a = p.parse_args()
    torch.manual_seed(0)
    model = GPT(a.vocab, a.d, max(1, a.d // 64), a.layers, a.seq).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i in range(a.steps):
        with torch.profiler.record_function("ProfilerStep#%d" % i):
            x = torch.randint(0, a.vocab, (a.batch, a.seq), device=a.device)
            y = torch.randint(0, a.vocab, (a.batch, a.seq), device=a.device)
            with torch.autocast(torch.device(a.device).type, dtype=torch.bfloat16, enabled=a.amp):
                logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, a.vocab), y.view(-1))
            del logits
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            print("step %d loss %.4f" % (i, loss.item()))
            del x, y, loss


if __name__ == "__main__":
    main()
