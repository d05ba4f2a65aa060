#!/usr/bin/env python3
"""Reference Hugging Face models in PyTorch, for Tessera's `import hf` / `export hf` tests.

GPT2LMHeadModel, LlamaForCausalLM and T5ForConditionalGeneration written out from their
published definitions (the
`transformers` package is not in Debian): they read a model folder exactly as
`from_pretrained` would -- config.json, then model.safetensors or a sharded
model.safetensors.index.json -- with HF's key names and layouts (GPT-2's Conv1D weights
stored [in, out]; LLaMA's q/k rows in the rotate_half order HF's conversion script writes).

    /usr/bin/python3 tools/hf_reference.py --write
        writes tests/golden/hf/{gpt2,llama,t5,t5v11}/ (a tiny model folder each: GPT-2 in F32
        in one file with the causal-mask buffers old checkpoints carry; LLaMA in BF16 over two
        shards; T5 v1.0 and v1.1 in F32) and tests/golden/hf/<name>_logits.safetensors (I32
        tokens [B,T], for T5 also decoder_tokens [B,Td], and the reference's F32 logits).
        Deterministic.
    /usr/bin/python3 tools/hf_reference.py --check DIR --golden FILE
        loads DIR (e.g. written by `tessera export hf`), runs the reference on the golden
        tokens and compares with the golden logits: exit 0 when max|diff| / max|golden|
        <= 1e-4, 1 otherwise; exit 77 (a skip for ctest) when torch is missing.
"""
import argparse
import json
import math
import os
import struct
import sys

try:
    import torch
except ImportError:  # ctest treats 77 as skipped
    print("torch is not installed (apt-get install python3-torch); skipping")
    sys.exit(77)

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "hf")
TOLERANCE = 1e-4

# ---------------------------------------------------------------- safetensors
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
           "I32": torch.int32, "U8": torch.uint8}
_NAMES = {v: k for k, v in _DTYPES.items()}


def write_safetensors(path, tensors, metadata=None):
    assert sys.byteorder == "little"
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        raw = bytearray(data[8 + n + b:8 + n + e])
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(_DTYPES[info["dtype"]]).reshape(info["shape"]).clone()
    return out


def read_model_folder(folder):
    """config.json and every tensor, as from_pretrained finds them."""
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(folder, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for name in files:
            tensors.update(read_safetensors(os.path.join(folder, name)))
    else:
        tensors = read_safetensors(os.path.join(folder, "model.safetensors"))
    return config, {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


# ---------------------------------------------------------------- the two models
def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def causal_softmax_attention(q, k, v):  # [B,H,T,D]
    t = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(s, -1) @ v


def gpt2_logits(config, w, tokens):
    """GPT2LMHeadModel: Conv1D layers compute x @ W + b with W stored [in, out]."""
    p = "transformer." if "transformer.wte.weight" in w else ""
    C, H = config["n_embd"], config["n_head"]
    eps = config.get("layer_norm_epsilon", 1e-5)
    B, T = tokens.shape
    x = w[p + "wte.weight"][tokens.long()] + w[p + "wpe.weight"][:T]
    for i in range(config["n_layer"]):
        h = f"{p}h.{i}."
        a = layer_norm(x, w[h + "ln_1.weight"], w[h + "ln_1.bias"], eps)
        qkv = a @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2))
        a = causal_softmax_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + a @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        m = layer_norm(x, w[h + "ln_2.weight"], w[h + "ln_2.bias"], eps)
        m = m @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"]
        m = 0.5 * m * (1 + torch.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))
        x = x + m @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    x = layer_norm(x, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)
    head = w[p + "wte.weight"] if config.get("tie_word_embeddings", True) else w["lm_head.weight"]
    return x @ head.t()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def llama_logits(config, w, tokens):
    """LlamaForCausalLM: nn.Linear weights [out, in]; RoPE by rotate_half; GQA repeat_kv."""
    C, H = config["hidden_size"], config["num_attention_heads"]
    Hkv = config.get("num_key_value_heads", H)
    D, eps = C // H, config.get("rms_norm_eps", 1e-6)
    B, T = tokens.shape
    inv_freq = 1.0 / (config.get("rope_theta", 10000.0) **
                      (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    ang = torch.cat([ang, ang], dim=-1)
    cos, sin = ang.cos().float(), ang.sin().float()
    x = w["model.embed_tokens.weight"][tokens.long()]
    for i in range(config["num_hidden_layers"]):
        L = f"model.layers.{i}."
        a = rms_norm(x, w[L + "input_layernorm.weight"], eps)
        q = (a @ w[L + "self_attn.q_proj.weight"].t()).view(B, T, H, D).transpose(1, 2)
        k = (a @ w[L + "self_attn.k_proj.weight"].t()).view(B, T, Hkv, D).transpose(1, 2)
        v = (a @ w[L + "self_attn.v_proj.weight"].t()).view(B, T, Hkv, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        a = causal_softmax_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + a @ w[L + "self_attn.o_proj.weight"].t()
        m = rms_norm(x, w[L + "post_attention_layernorm.weight"], eps)
        g, u = m @ w[L + "mlp.gate_proj.weight"].t(), m @ w[L + "mlp.up_proj.weight"].t()
        x = x + (g * torch.sigmoid(g) * u) @ w[L + "mlp.down_proj.weight"].t()
    x = rms_norm(x, w["model.norm.weight"], eps)
    tied = config.get("tie_word_embeddings", False)
    return x @ (w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]).t()


def t5_bucket(rel, bidirectional, buckets, max_distance):
    """T5Attention._relative_position_bucket: the bucket of key offset rel = j - i."""
    out = torch.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        out += (rel > 0).long() * buckets
        n = rel.abs()
    else:
        n = -torch.min(rel, torch.zeros_like(rel))
    exact = buckets // 2
    large = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact)
                     * (buckets - exact)).long()
    large = torch.min(large, torch.full_like(large, buckets - 1))
    return out + torch.where(n < exact, n, large)


def t5_logits(config, w, tokens, decoder_tokens):
    """T5ForConditionalGeneration: nn.Linear weights [out, in]; T5LayerNorm (scale only); no
    attention scaling; a relative position bias from block 0's table shared by the stack's
    blocks (none in cross-attention); the tied head scaled by d_model^-0.5."""
    C, H, D = config["d_model"], config["num_heads"], config["d_kv"]
    eps = config.get("layer_norm_epsilon", 1e-6)
    nb = config.get("relative_attention_num_buckets", 32)
    md = config.get("relative_attention_max_distance", 128)
    gated = config.get("feed_forward_proj", "relu") == "gated-gelu"

    def bias(table, tq, tk, bidirectional):
        rel = torch.arange(tk)[None, :] - torch.arange(tq)[:, None]
        return table[t5_bucket(rel, bidirectional, nb, md)].permute(2, 0, 1)  # [H, tq, tk]

    def attention(x, kv, p, pos_bias, causal):
        B, tq, tk = x.shape[0], x.shape[1], kv.shape[1]
        q = (x @ w[p + "q.weight"].t()).view(B, tq, H, D).transpose(1, 2)
        k = (kv @ w[p + "k.weight"].t()).view(B, tk, H, D).transpose(1, 2)
        v = (kv @ w[p + "v.weight"].t()).view(B, tk, H, D).transpose(1, 2)
        s = q @ k.transpose(-1, -2) + pos_bias
        if causal:
            s = s.masked_fill(torch.triu(torch.ones(tq, tk, dtype=torch.bool), 1), float("-inf"))
        a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, tq, H * D)
        return a @ w[p + "o.weight"].t()

    def feed_forward(x, p):
        if gated:
            g = x @ w[p + "wi_0.weight"].t()
            g = 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
            h = g * (x @ w[p + "wi_1.weight"].t())
        else:
            h = torch.relu(x @ w[p + "wi.weight"].t())
        return h @ w[p + "wo.weight"].t()

    shared = w["shared.weight"]
    x = shared[tokens.long()]
    te, td = tokens.shape[1], decoder_tokens.shape[1]
    enc_bias = bias(w["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
                    te, te, True)
    for i in range(config["num_layers"]):
        b = f"encoder.block.{i}.layer."
        x = x + attention(rms_norm(x, w[b + "0.layer_norm.weight"], eps),
                          rms_norm(x, w[b + "0.layer_norm.weight"], eps),
                          b + "0.SelfAttention.", enc_bias, False)
        x = x + feed_forward(rms_norm(x, w[b + "1.layer_norm.weight"], eps), b + "1.DenseReluDense.")
    x = rms_norm(x, w["encoder.final_layer_norm.weight"], eps)
    y = shared[decoder_tokens.long()]
    dec_bias = bias(w["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
                    td, td, False)
    for i in range(config.get("num_decoder_layers", config["num_layers"])):
        b = f"decoder.block.{i}.layer."
        h = rms_norm(y, w[b + "0.layer_norm.weight"], eps)
        y = y + attention(h, h, b + "0.SelfAttention.", dec_bias, True)
        y = y + attention(rms_norm(y, w[b + "1.layer_norm.weight"], eps), x,
                          b + "1.EncDecAttention.", torch.zeros(1), False)
        y = y + feed_forward(rms_norm(y, w[b + "2.layer_norm.weight"], eps), b + "2.DenseReluDense.")
    y = rms_norm(y, w["decoder.final_layer_norm.weight"], eps)
    if config.get("tie_word_embeddings", True):
        return (y * C ** -0.5) @ shared.t()
    return y @ w["lm_head.weight"].t()


def logits_of(folder, tokens, decoder_tokens=None):
    config, w = read_model_folder(folder)
    with torch.no_grad():
        if config["model_type"] == "t5":
            return t5_logits(config, w, tokens, decoder_tokens)
        run = {"gpt2": gpt2_logits, "llama": llama_logits}[config["model_type"]]
        return run(config, w, tokens)


# ---------------------------------------------------------------- golden folders
GPT2_CONFIG = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 511, "embd_pdrop": 0.1, "eos_token_id": 511,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 32, "n_embd": 64, "n_head": 4, "n_inner": None, "n_layer": 2, "n_positions": 32,
    "reorder_and_upcast_attn": False, "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False,
    "scale_attn_weights": True, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "torch_dtype": "float32", "transformers_version": "4.40.0", "use_cache": True,
    "vocab_size": 512}

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 64,
    "initializer_range": 0.02, "intermediate_size": 160, "max_position_embeddings": 64,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0",
    "use_cache": True, "vocab_size": 512}


T5_CONFIG = {  # T5 v1.0's layout: relu, a tied head; heads narrower than d_model / num_heads
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 96, "d_kv": 8, "d_model": 64,
    "decoder_start_token_id": 0, "dense_act_fn": "relu", "dropout_rate": 0.1,
    "eos_token_id": 1, "feed_forward_proj": "relu", "initializer_factor": 1.0,
    "is_encoder_decoder": True, "is_gated_act": False, "layer_norm_epsilon": 1e-06,
    "model_type": "t5", "n_positions": 512, "num_decoder_layers": 2, "num_heads": 4,
    "num_layers": 2, "output_past": True, "pad_token_id": 0,
    "relative_attention_max_distance": 20, "relative_attention_num_buckets": 32,
    "torch_dtype": "float32", "transformers_version": "4.40.0", "use_cache": True,
    "vocab_size": 512}

T5V11_CONFIG = dict(T5_CONFIG, **{  # T5 v1.1's: gated GELU, an untied head
    "d_kv": 16, "dense_act_fn": "gelu_new", "feed_forward_proj": "gated-gelu",
    "is_gated_act": True, "relative_attention_max_distance": 6,
    "relative_attention_num_buckets": 8, "tie_word_embeddings": False})


def t5_weights(c, g):
    C, V, F, I = c["d_model"], c["vocab_size"], c["d_ff"], c["num_heads"] * c["d_kv"]
    nb, H = c["relative_attention_num_buckets"], c["num_heads"]
    rnd = lambda *s, std=0.05: torch.randn(*s, generator=g) * std  # noqa: E731
    gated = c["feed_forward_proj"] == "gated-gelu"
    w = {"shared.weight": rnd(V, C, std=1.0)}
    for side, layers in (("encoder", c["num_layers"]), ("decoder", c["num_decoder_layers"])):
        for i in range(layers):
            b = f"{side}.block.{i}.layer."
            subs = ["SelfAttention", "EncDecAttention"] if side == "decoder" else ["SelfAttention"]
            for j, name in enumerate(subs):
                w[f"{b}{j}.layer_norm.weight"] = 1 + rnd(C, std=0.1)
                for m in "qkv":
                    w[f"{b}{j}.{name}.{m}.weight"] = rnd(I, C, std=0.2)
                w[f"{b}{j}.{name}.o.weight"] = rnd(C, I, std=0.2)
                if i == 0 and name == "SelfAttention":
                    w[f"{b}0.SelfAttention.relative_attention_bias.weight"] = rnd(nb, H, std=0.5)
            f = f"{b}{len(subs)}."
            w[f + "layer_norm.weight"] = 1 + rnd(C, std=0.1)
            for wi in (["wi_0", "wi_1"] if gated else ["wi"]):
                w[f + "DenseReluDense." + wi + ".weight"] = rnd(F, C, std=0.2)
            w[f + "DenseReluDense.wo.weight"] = rnd(C, F, std=0.2)
        w[f"{side}.final_layer_norm.weight"] = 1 + rnd(C, std=0.1)
    if not c.get("tie_word_embeddings", True):
        w["lm_head.weight"] = rnd(V, C)
    return w


def gpt2_weights(c, g):
    C, V, F = c["n_embd"], c["vocab_size"], 4 * c["n_embd"]
    rnd = lambda *s, std=0.05: torch.randn(*s, generator=g) * std  # noqa: E731
    w = {"transformer.wte.weight": rnd(V, C), "transformer.wpe.weight": rnd(c["n_positions"], C)}
    n = c["n_positions"]
    for i in range(c["n_layer"]):
        h = f"transformer.h.{i}."
        w[h + "ln_1.weight"], w[h + "ln_1.bias"] = 1 + rnd(C, std=0.1), rnd(C, std=0.1)
        # The causal-mask buffer older checkpoints carry (U8): readers skip it.
        w[h + "attn.bias"] = torch.tril(torch.ones(n, n, dtype=torch.uint8)).view(1, 1, n, n)
        w[h + "attn.c_attn.weight"], w[h + "attn.c_attn.bias"] = rnd(C, 3 * C), rnd(3 * C)
        w[h + "attn.c_proj.weight"], w[h + "attn.c_proj.bias"] = rnd(C, C), rnd(C)
        w[h + "ln_2.weight"], w[h + "ln_2.bias"] = 1 + rnd(C, std=0.1), rnd(C, std=0.1)
        w[h + "mlp.c_fc.weight"], w[h + "mlp.c_fc.bias"] = rnd(C, F), rnd(F)
        w[h + "mlp.c_proj.weight"], w[h + "mlp.c_proj.bias"] = rnd(F, C), rnd(C)
    w["transformer.ln_f.weight"] = 1 + rnd(C, std=0.1)
    w["transformer.ln_f.bias"] = rnd(C, std=0.1)
    return w


def llama_weights(c, g):
    C, V, F = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    D = C // c["num_attention_heads"]
    Hkv = c["num_key_value_heads"]
    rnd = lambda *s, std=0.05: torch.randn(*s, generator=g) * std  # noqa: E731
    w = {"model.embed_tokens.weight": rnd(V, C)}
    for i in range(c["num_hidden_layers"]):
        L = f"model.layers.{i}."
        w[L + "input_layernorm.weight"] = 1 + rnd(C, std=0.1)
        w[L + "self_attn.q_proj.weight"] = rnd(C, C)
        w[L + "self_attn.k_proj.weight"] = rnd(Hkv * D, C)
        w[L + "self_attn.v_proj.weight"] = rnd(Hkv * D, C)
        w[L + "self_attn.o_proj.weight"] = rnd(C, C)
        w[L + "post_attention_layernorm.weight"] = 1 + rnd(C, std=0.1)
        w[L + "mlp.gate_proj.weight"] = rnd(F, C)
        w[L + "mlp.up_proj.weight"] = rnd(F, C)
        w[L + "mlp.down_proj.weight"] = rnd(C, F)
    w["model.norm.weight"] = 1 + rnd(C, std=0.1)
    w["lm_head.weight"] = rnd(V, C)
    return {k: v.to(torch.bfloat16) for k, v in w.items()}  # stored as BF16


def write_golden():
    g = torch.Generator().manual_seed(2026)
    # The T5 folders draw from a generator of their own, so GPT-2's and LLaMA's stay as written.
    g5 = torch.Generator().manual_seed(2027)
    for name, config, weights in (("gpt2", GPT2_CONFIG, gpt2_weights(GPT2_CONFIG, g)),
                                  ("llama", LLAMA_CONFIG, llama_weights(LLAMA_CONFIG, g)),
                                  ("t5", T5_CONFIG, t5_weights(T5_CONFIG, g5)),
                                  ("t5v11", T5V11_CONFIG, t5_weights(T5V11_CONFIG, g5))):
        folder = os.path.join(GOLDEN, name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")
        if name == "gpt2":
            write_safetensors(os.path.join(folder, "model.safetensors"), weights,
                              {"format": "pt"})
        else:  # two shards and an index, as save_pretrained writes large models
            keys = list(weights)
            parts = [keys[:len(keys) // 2], keys[len(keys) // 2:]]
            weight_map = {}
            for j, part in enumerate(parts):
                file = f"model-{j + 1:05d}-of-{len(parts):05d}.safetensors"
                write_safetensors(os.path.join(folder, file), {k: weights[k] for k in part},
                                  {"format": "pt"})
                weight_map.update({k: file for k in part})
            total = sum(t.numel() * t.element_size() for t in weights.values())
            with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f,
                          indent=2, sort_keys=True)
                f.write("\n")
        if config["model_type"] == "t5":
            # span_corruption(40) in Tessera: 36 encoder and 8 decoder tokens.
            tokens = torch.randint(0, config["vocab_size"], (2, 36), generator=g5,
                                   dtype=torch.int32)
            dec = torch.randint(0, config["vocab_size"], (2, 8), generator=g5, dtype=torch.int32)
            logits = logits_of(folder, tokens, dec)
            out = {"tokens": tokens, "decoder_tokens": dec, "logits": logits.contiguous()}
        else:
            tokens = torch.randint(0, config["vocab_size"], (2, 16), generator=g,
                                   dtype=torch.int32)
            logits = logits_of(folder, tokens)
            out = {"tokens": tokens, "logits": logits.contiguous()}
        write_safetensors(os.path.join(GOLDEN, f"{name}_logits.safetensors"), out)
        print(f"{name}: logits {tuple(logits.shape)}, max |logit| {logits.abs().max():.4f}")


def check(folder, golden):
    ref = read_safetensors(golden)
    got = logits_of(folder, ref["tokens"], ref.get("decoder_tokens"))
    err = ((got - ref["logits"]).abs().max() / ref["logits"].abs().max()).item()
    ok = err <= TOLERANCE
    print(f"{folder}: max |diff| / max |golden| = {err:.2e} ({'ok' if ok else 'FAILED'}, "
          f"tolerance {TOLERANCE:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="write the golden folders")
    ap.add_argument("--check", metavar="DIR", help="a model folder to check")
    ap.add_argument("--golden", metavar="FILE", help="the *_logits.safetensors to check against")
    args = ap.parse_args()
    if args.write:
        write_golden()
    elif args.check and args.golden:
        sys.exit(check(args.check, args.golden))
    else:
        ap.error("pass --write, or --check DIR --golden FILE")
