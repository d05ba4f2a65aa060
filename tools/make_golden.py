#!/usr/bin/env python3
"""Generate golden reference files for Tessera's tiny GPT and LLaMA models.

Run with Debian's python (has torch):

    /usr/bin/python3 tools/make_golden.py

Writes tests/golden/gpt_tiny.safetensors and tests/golden/llama_tiny.safetensors.
See tests/golden/README.md for the exact conventions.
"""
import json
import math
import os
import struct
import sys

import torch

torch.set_num_threads(1)
torch.set_default_dtype(torch.float32)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests", "golden")

OPT = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
           grad_clip=1.0, steps=10)
MAX_FILE_BYTES = 3 * 1024 * 1024


# ---------------------------------------------------------------- safetensors
_DT = {torch.float32: ("F32", 4), torch.int32: ("I32", 4)}


def write_safetensors(path, tensors, metadata):
    header = {}
    blobs = []
    off = 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        dt, _ = _DT[t.dtype]
        # numpy-free little-endian bytes (host is little-endian; assert it)
        assert sys.byteorder == "little"
        raw = t.numpy().tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dtype = {"F32": torch.float32, "I32": torch.int32}[info["dtype"]]
        buf = bytearray(data[base + b:base + e])
        t = torch.frombuffer(buf, dtype=dtype) if len(buf) else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    assert base + max(i["data_offsets"][1] for i in header.values()) == len(data)
    return out, meta


# ---------------------------------------------------------------- common ops
def linear(x, w, b=None):
    y = x @ w.t()
    return y + b if b is not None else y


def layer_norm(x, w, b, eps):
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)  # biased
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x * torch.sigmoid(x)


def causal_attention(q, k, v):
    # q,k,v: [B,H,T,D]
    T, D = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # j > i
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def cross_entropy_mean(logits, targets):
    V = logits.shape[-1]
    lp = torch.log_softmax(logits.reshape(-1, V), dim=-1)
    return -lp.gather(1, targets.reshape(-1, 1).long()).mean()


# ---------------------------------------------------------------- GPT
GPT_CFG = dict(model="gpt", vocab_size=512, block_size=32, n_layer=2, n_embd=64,
               n_head=4, head_dim=16, ln_eps=1e-5, batch_size=2, seq_len=16,
               seed=1234, tied_lm_head="true", activation="gelu_tanh")


def gpt_init(cfg, g):
    V, C, L = cfg["vocab_size"], cfg["n_embd"], cfg["n_layer"]
    P = {}

    def mat(*s, std=0.02):
        return torch.randn(*s, generator=g) * std

    def nw(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    def bias(n):
        return 0.1 * torch.randn(n, generator=g)

    P["wte"] = mat(V, C)
    P["wpe"] = mat(cfg["block_size"], C)
    for i in range(L):
        p = f"h.{i}."
        P[p + "ln_1.weight"] = nw(C)
        P[p + "ln_1.bias"] = bias(C)
        P[p + "attn.qkv.weight"] = mat(3 * C, C)
        P[p + "attn.qkv.bias"] = bias(3 * C)
        P[p + "attn.proj.weight"] = mat(C, C)
        P[p + "attn.proj.bias"] = bias(C)
        P[p + "ln_2.weight"] = nw(C)
        P[p + "ln_2.bias"] = bias(C)
        P[p + "mlp.fc.weight"] = mat(4 * C, C)
        P[p + "mlp.fc.bias"] = bias(4 * C)
        P[p + "mlp.proj.weight"] = mat(C, 4 * C)
        P[p + "mlp.proj.bias"] = bias(C)
    P["ln_f.weight"] = nw(C)
    P["ln_f.bias"] = bias(C)
    return P


def gpt_forward(cfg, P, tokens):
    B, T = tokens.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    D = C // H
    eps = cfg["ln_eps"]
    x = P["wte"][tokens.long()] + P["wpe"][:T]
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        h = layer_norm(x, P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
        qkv = linear(h, P[p + "attn.qkv.weight"], P[p + "attn.qkv.bias"])
        q, k, v = qkv.split(C, dim=-1)
        q = q.reshape(B, T, H, D).transpose(1, 2)
        k = k.reshape(B, T, H, D).transpose(1, 2)
        v = v.reshape(B, T, H, D).transpose(1, 2)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, P[p + "attn.proj.weight"], P[p + "attn.proj.bias"])
        h = layer_norm(x, P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
        h = gelu_tanh(linear(h, P[p + "mlp.fc.weight"], P[p + "mlp.fc.bias"]))
        x = x + linear(h, P[p + "mlp.proj.weight"], P[p + "mlp.proj.bias"])
    x = layer_norm(x, P["ln_f.weight"], P["ln_f.bias"], eps)
    return x @ P["wte"].t()


# ---------------------------------------------------------------- LLaMA
LLAMA_CFG = dict(model="llama", vocab_size=512, n_layer=2, dim=64, n_head=4,
                 n_kv_head=2, head_dim=16, ffn_hidden=128, rms_eps=1e-5,
                 rope_theta=10000.0, rope_style="rotate_half", batch_size=2,
                 seq_len=16, seed=5678, tied_lm_head="false", activation="swiglu")


def llama_init(cfg, g):
    V, C, L = cfg["vocab_size"], cfg["dim"], cfg["n_layer"]
    H, Hkv, D, F = cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"], cfg["ffn_hidden"]
    P = {}

    def mat(*s, std=0.02):
        return torch.randn(*s, generator=g) * std

    def nw(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    P["tok_emb"] = mat(V, C)
    for i in range(L):
        p = f"h.{i}."
        P[p + "attn_norm.weight"] = nw(C)
        P[p + "attn.q.weight"] = mat(H * D, C)
        P[p + "attn.k.weight"] = mat(Hkv * D, C)
        P[p + "attn.v.weight"] = mat(Hkv * D, C)
        P[p + "attn.o.weight"] = mat(C, H * D)
        P[p + "mlp_norm.weight"] = nw(C)
        P[p + "mlp.gate.weight"] = mat(F, C)
        P[p + "mlp.up.weight"] = mat(F, C)
        P[p + "mlp.down.weight"] = mat(C, F)
    P["norm.weight"] = nw(C)
    P["lm_head.weight"] = mat(V, C)
    return P


def rope(x, theta):
    # x: [B,T,nh,D]; rotate_half (HF / NeoX) convention
    B, T, nh, D = x.shape
    half = D // 2
    i = torch.arange(half, dtype=torch.float32)
    freq = theta ** (-2.0 * i / D)                      # [D/2]
    ang = torch.arange(T, dtype=torch.float32)[:, None] * freq[None, :]  # [T,D/2]
    cos = torch.cos(ang)[None, :, None, :]
    sin = torch.sin(ang)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def llama_forward(cfg, P, tokens):
    B, T = tokens.shape
    C, H, Hkv, D = cfg["dim"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"]
    eps, theta = cfg["rms_eps"], cfg["rope_theta"]
    rep = H // Hkv
    x = P["tok_emb"][tokens.long()]
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        h = rms_norm(x, P[p + "attn_norm.weight"], eps)
        q = linear(h, P[p + "attn.q.weight"]).reshape(B, T, H, D)
        k = linear(h, P[p + "attn.k.weight"]).reshape(B, T, Hkv, D)
        v = linear(h, P[p + "attn.v.weight"]).reshape(B, T, Hkv, D)
        q, k = rope(q, theta), rope(k, theta)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        # query head h uses kv head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * D)
        x = x + linear(y, P[p + "attn.o.weight"])
        h = rms_norm(x, P[p + "mlp_norm.weight"], eps)
        m = silu(linear(h, P[p + "mlp.gate.weight"])) * linear(h, P[p + "mlp.up.weight"])
        x = x + linear(m, P[p + "mlp.down.weight"])
    x = rms_norm(x, P["norm.weight"], eps)
    return x @ P["lm_head.weight"].t()


# ---------------------------------------------------------------- driver
def make(cfg, init_fn, fwd_fn, fname, traj_keep):
    g = torch.Generator().manual_seed(cfg["seed"])
    torch.manual_seed(cfg["seed"])
    P0 = init_fn(cfg, g)
    for t in P0.values():
        assert t.dtype == torch.float32
    B, T, V = cfg["batch_size"], cfg["seq_len"], cfg["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int64).to(torch.int32)
    targets = torch.randint(0, V, (B, T), generator=g, dtype=torch.int64).to(torch.int32)

    # single forward/backward at init
    P = {k: v.clone().requires_grad_(True) for k, v in P0.items()}
    logits = fwd_fn(cfg, P, tokens)
    loss = cross_entropy_mean(logits, targets)
    loss.backward()
    grads = {k: v.grad.detach().clone() for k, v in P.items()}
    gnorm0 = torch.sqrt(sum((gr.double() ** 2).sum() for gr in grads.values())).item()

    # AdamW trajectory on the same batch
    P = {k: v.clone().requires_grad_(True) for k, v in P0.items()}
    decay = [v for v in P.values() if v.dim() >= 2]
    no_decay = [v for v in P.values() if v.dim() < 2]
    opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=OPT["weight_decay"]),
         dict(params=no_decay, weight_decay=0.0)],
        lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
    traj_loss, traj_norms = [], []
    for _ in range(OPT["steps"]):
        opt.zero_grad(set_to_none=True)
        l = cross_entropy_mean(fwd_fn(cfg, P, tokens), targets)
        l.backward()
        traj_loss.append(l.item())
        n = torch.nn.utils.clip_grad_norm_(list(P.values()), OPT["grad_clip"])
        traj_norms.append(n.item())
        opt.step()

    tensors = {}
    for k, v in P0.items():
        tensors["param." + k] = v
    tensors["input.tokens"] = tokens
    tensors["input.targets"] = targets
    tensors["out.logits"] = logits.detach()
    tensors["out.loss"] = loss.detach().reshape(1)
    for k, v in grads.items():
        tensors["grad." + k] = v
    tensors["traj.loss"] = torch.tensor(traj_loss, dtype=torch.float32)
    keep = list(P.keys()) if traj_keep is None else traj_keep
    for k in keep:
        tensors["traj.param." + k] = P[k].detach()

    meta = {k: (repr(v) if isinstance(v, float) else str(v)) for k, v in cfg.items()}
    meta.update({"optimizer": "AdamW", "lr": "0.001", "lr_schedule": "constant",
                 "beta1": "0.9", "beta2": "0.95", "adam_eps": "1e-08",
                 "weight_decay": "0.1",
                 "weight_decay_rule": "0.1 for params with dim>=2 (matrices and embeddings), 0.0 for dim<2",
                 "grad_clip": "1.0", "traj_steps": str(OPT["steps"]),
                 "loss": "mean cross-entropy over all B*T positions",
                 "traj_params": "all" if traj_keep is None else ",".join(traj_keep),
                 "torch_version": torch.__version__})

    path = os.path.join(OUT_DIR, fname)
    write_safetensors(path, tensors, meta)
    size = os.path.getsize(path)
    assert size <= MAX_FILE_BYTES, (fname, size)

    # verify the writer
    back, meta_back = read_safetensors(path)
    assert list(back.keys()) == list(tensors.keys())
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert torch.equal(back[k], v.detach()), k
    assert meta_back == meta

    nparam = sum(v.numel() for v in P0.values())
    print(f"== {fname}: {size} bytes, {len(tensors)} tensors")
    print(f"   params: {nparam}")
    print(f"   initial loss: {loss.item():.6f} (ln V = {math.log(V):.6f})")
    print(f"   initial global grad norm: {gnorm0:.6f}")
    print(f"   traj loss:  {[round(x, 6) for x in traj_loss]}")
    print(f"   traj grad norms (pre-clip): {[round(x, 4) for x in traj_norms]}")
    assert gnorm0 > OPT["grad_clip"], "clipping must be exercised"
    assert abs(traj_loss[0] - loss.item()) < 1e-6
    return size


def main():
    torch.manual_seed(0)
    os.makedirs(OUT_DIR, exist_ok=True)
    make(GPT_CFG, gpt_init, gpt_forward, "gpt_tiny.safetensors", None)
    make(LLAMA_CFG, llama_init, llama_forward, "llama_tiny.safetensors", None)


if __name__ == "__main__":
    main()
