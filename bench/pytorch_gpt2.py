#!/usr/bin/env python3
"""GPT-2 124M (AdamW) training speed in PyTorch, the anchor of bench/run_speed.sh (CPU, fp32)
and of bench/run_cuda_train.sh (GPU: fp32 or bf16 autocast, eager or torch.compile).

The model is the one Tessera's gpt2-small preset builds: tied token embedding and LM head,
learned positions, pre-LayerNorm blocks, GELU (tanh), causal attention, biases everywhere,
AdamW with decoupled weight decay on matrices and embeddings, global-norm clipping at 1.0.

  /usr/bin/python3 bench/pytorch_gpt2.py --batch 4 --seq 64 --steps 3 --threads 2

  python3 bench/pytorch_gpt2.py --device cuda --precision bf16 --compile --batch 16 --seq 1024

On CUDA the attention is F.scaled_dot_product_attention (flash), AdamW is the fused one and
bf16 runs under autocast (fp32 master weights), as llm.c's train_gpt2.py does; f32 matrix
products stay f32 (no TF32: Tessera's f32 GEMMs are full f32, so both sides do the same math).

--vocab-rows 50304 pads the token embedding (and the LM head) to a multiple of 64 rows, as
llm.c does; the loss is still over the 50,257 classes (the padding logits are sliced off), the
model Tessera builds with ModelConfig::padded_vocab_size.

Prints one line: `pytorch B=4 T=64 vocab_rows=50257 steps=3 s_per_step=... tokens_per_s=...`.
"""
import argparse
import contextlib
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(c, eps=1e-5)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c, eps=1e-5)
        self.fc = nn.Linear(c, 4 * c)
        self.fc_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        if x.is_cuda:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
            x = x + self.proj(y.reshape(b, t, c))
            return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))
        # Causal attention written out (torch 1.13 has no fused CPU kernel).
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.h))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=50257, rows=50257, ctx=1024, c=768, layers=12, heads=12):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(rows, c)
        self.wpe = nn.Embedding(ctx, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c, eps=1e-5)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x).view(-1, x.shape[-1]) @ self.wte.weight.t()  # tied head
        if logits.shape[-1] != self.vocab:  # padded rows: not classes
            logits = logits[:, :self.vocab]
        return F.cross_entropy(logits, targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--vocab-rows", type=int, default=50257)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if a.vocab_rows < 50257:
        ap.error("--vocab-rows must be at least the vocabulary, 50257")
    model = GPT(rows=a.vocab_rows).to(dev)
    fwd = torch.compile(model) if a.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if cuda else {}))
    g = torch.Generator().manual_seed(1)
    bf16 = cuda and a.precision == "bf16"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step():
        x = torch.randint(0, 50257, (a.batch, a.seq), generator=g).to(dev)
        y = torch.randint(0, 50257, (a.batch, a.seq), generator=g).to(dev)
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    # Each step ends in loss.item(), which waits for the device: wall time is device time.
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    dt = sorted(times)[len(times) // 2]  # median
    print(f"pytorch B={a.batch} T={a.seq} vocab_rows={a.vocab_rows} steps={a.steps} "
          f"s_per_step={dt:.4f} "
          f"tokens_per_s={a.batch * a.seq / dt:.2f}", flush=True)


if __name__ == "__main__":
    main()
