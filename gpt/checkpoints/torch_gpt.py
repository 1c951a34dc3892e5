"""gpt/model/transformer.py's GPT written again in PyTorch, with nanoGPT's names and layout: the reference that
the tests and the benchmarks compare microtensor with.

Two uses, one model. tests/test_convert.py loads microtensor's export (gpt/checkpoints/convert.py) into it
and checks that both compute the same logits, loss and gradients: the export is right only if a
PyTorch model of the same architecture, written independently of microtensor, reads it into the
same function. The benchmarks (bench/torch_side.py) load a microtensor GPT's weights into it
(`from_arrays`) and time it against microtensor, in training and in generation with a KV cache.
It is written the way a PyTorch user would write it: nn.Linear, F.scaled_dot_product_attention.

The architecture, option by option (gpt/model/transformer.py says the same in microtensor's terms):

    x = wte(idx) [+ wpe(0 .. T-1) if pos == "learned"]                       (B, T, C)
    each block:  x = x + attn(norm(x));  x = x + mlp(norm(x))                pre-norm residual stream
    norm:  LayerNorm (eps 1e-5, bias only with bias=True)  or  RMSNorm (eps 1e-5, weight only)
    attn:  q, k, v = split(c_attn(x), C) into H heads of D = C / H           each (B, H, T, D)
           with pos == "rope": rotate the pairs (x_2i, x_2i+1) of q and k by t θ_i, θ_i = 10000^(-2i/D)
           y = softmax(q kᵀ / sqrt(D), causal) v, heads merged, then c_proj
    mlp:   gelu:   c_proj(gelu_tanh(c_fc(x))),             hidden 4C
           swiglu: c_proj(silu(c_fc(x)) * c_up(x)),         hidden 8 ceil(8C / 3 / 8)
    logits = ln_f(x) @ wteᵀ (tie_weights: lm_head.weight IS transformer.wte.weight, as in nanoGPT)
             or lm_head(ln_f(x)) (a bias-free Linear)
    loss = mean cross-entropy over the (B, T) targets

Linear weights are PyTorch's (out, in), so the export's tensors load as they are (a microtensor
Linear's are (in, out): `from_arrays` transposes them). The model takes its config as a plain dict
(the export's metadata, or GPTConfig.to_dict()), so nothing here imports microtensor; it imports
torch, so only code that has torch imports it.
"""
import json
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def rope(x, offset=0, base=10000.0):
    """Rotate each pair (x_2i, x_2i+1) of x (B, H, T, D), at positions offset .. offset + T - 1, by
    the angle t θ_i, θ_i = base^(-2i/D)."""
    T, D = x.shape[-2], x.shape[-1]
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    angle = torch.arange(offset, offset + T, dtype=torch.float64)[:, None] * theta[None, :]  # (T, D/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (B, H, T, D/2) each
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)  # pairs back in place


def norm(config):
    if config["norm"] == "rmsnorm":
        return nn.RMSNorm(config["n_embd"], eps=1e-5)
    return nn.LayerNorm(config["n_embd"], eps=1e-5, bias=config["bias"])


def causal_attention(q, k, v):
    """Queries (B, H, Tq, D) that are the last Tq of Tk positions: query i sees keys up to Tk - Tq + i."""
    Tq, Tk = q.shape[2], k.shape[2]
    if Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if Tq == 1:
        return F.scaled_dot_product_attention(q, k, v)  # the newest token sees every key
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class KVCache:
    """Preallocated keys and values (B, H, block_size, D) and a write position, as in gpt/model/transformer.py."""

    def __init__(self, batch, n_head, block_size, head_size):
        self.k = torch.zeros(batch, n_head, block_size, head_size)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def append(self, k, v):
        T = k.shape[2]
        self.k[:, :, self.length : self.length + T] = k
        self.v[:, :, self.length : self.length + T] = v
        self.length += T
        return self.k[:, :, : self.length], self.v[:, :, : self.length]


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        C = config["n_embd"]
        self.n_head, self.rope = config["n_head"], config["pos"] == "rope"
        self.c_attn = nn.Linear(C, 3 * C, bias=config["bias"])
        self.c_proj = nn.Linear(C, C, bias=config["bias"])
        self.resid_dropout = nn.Dropout(config["dropout"])

    def forward(self, x, cache=None, offset=0):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if self.rope:
            q, k = rope(q, offset), rope(k, offset)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, offset + T, D)
        y = causal_attention(q, k, v)  # (B, H, T, D)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        C = config["n_embd"]
        self.swiglu = config["mlp"] == "swiglu"
        hidden = 8 * math.ceil(8 * C / 3 / 8) if self.swiglu else 4 * C
        self.c_fc = nn.Linear(C, hidden, bias=config["bias"])
        if self.swiglu:
            self.c_up = nn.Linear(C, hidden, bias=config["bias"])
        self.c_proj = nn.Linear(hidden, C, bias=config["bias"])
        self.dropout = nn.Dropout(config["dropout"])

    def forward(self, x):
        h = F.silu(self.c_fc(x)) * self.c_up(x) if self.swiglu else F.gelu(self.c_fc(x), approximate="tanh")
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = norm(config), CausalSelfAttention(config)
        self.ln_2, self.mlp = norm(config), MLP(config)

    def forward(self, x, cache=None, offset=0):
        x = x + self.attn(self.ln_1(x), cache, offset)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        C = config["n_embd"]
        parts = {"wte": nn.Embedding(config["vocab_size"], C)}
        if config["pos"] == "learned":
            parts["wpe"] = nn.Embedding(config["block_size"], C)
        parts["drop"] = nn.Dropout(config["dropout"])
        parts["h"] = nn.ModuleList(Block(config) for _ in range(config["n_layer"]))
        parts["ln_f"] = norm(config)
        self.transformer = nn.ModuleDict(parts)
        self.lm_head = nn.Linear(C, config["vocab_size"], bias=False)
        if config["tie_weights"]:
            self.lm_head.weight = self.transformer.wte.weight  # nanoGPT's tying: one Parameter, two names

    def forward(self, idx, targets=None, caches=None, offset=0):
        """Logits (B, T, V) and the loss; with `caches` (new_caches), idx holds the tokens after the
        `offset` already in them."""
        T = idx.shape[1]
        x = self.transformer.wte(idx)  # (B, T, C)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(offset, offset + T))
        x = self.transformer.drop(x)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, None if caches is None else caches[layer], offset)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, V)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def new_caches(self, batch):
        """One empty KVCache per block, for generation from position 0."""
        c = self.config
        return [KVCache(batch, c["n_head"], c["block_size"], c["n_embd"] // c["n_head"]) for _ in range(c["n_layer"])]


def read_file(path):
    """(tensors {name: torch tensor}, metadata {key: str}) of an export, read as a PyTorch user would."""
    path = str(path)
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}, f.metadata()
    with np.load(path, allow_pickle=False) as archive:
        metadata = json.loads(str(archive["__metadata__"]))
        return {name: torch.from_numpy(archive[name]) for name in archive.files if name != "__metadata__"}, metadata


def load_export(path):
    """(GPT holding the export's weights, in the file's dtype, metadata)."""
    tensors, metadata = read_file(path)
    config = json.loads(metadata["config"])
    for name, source in json.loads(metadata["tied_weights"]).items():
        tensors[name] = tensors[source]  # the file stores a tied tensor once
    # multi-token prediction's extra heads (mtp_heads.*, gpt/model/electives/mtp.py) stay in the file:
    # this model is the next-token one, which is all that sampling from it needs
    tensors = {name: t for name, t in tensors.items() if not name.startswith("mtp_heads.")}
    model = GPT(config).to(next(iter(tensors.values())).dtype)
    model.load_state_dict(tensors, strict=True)  # every name and shape must match
    return model, metadata


def from_arrays(config, arrays):
    """A GPT (in torch's default dtype) holding exactly the weights in `arrays`, a microtensor GPT's
    parameters by name (model.state_dict(): the same names). nn.Linear stores its weight as
    (out, in) where microtensor's is (in, out), so those are transposed."""
    theirs = GPT(config)
    with torch.no_grad():
        for name, p in theirs.named_parameters():  # a tied lm_head is listed once, as transformer.wte
            array = np.asarray(arrays[name])
            if array.ndim == 2 and not name.endswith(("wte.weight", "wpe.weight")):
                array = array.T  # Linear: (in, out) -> (out, in)
            if tuple(array.shape) != tuple(p.shape):
                raise ValueError(f"from_arrays: {name} is {tuple(p.shape)} but microtensor's is {array.shape}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(array)))
    return theirs


def from_microtensor(model):
    """A GPT with the weights of a microtensor GPT (in the same process)."""
    return from_arrays(model.config.to_dict(), {name: p.data for name, p in model.named_parameters()})
