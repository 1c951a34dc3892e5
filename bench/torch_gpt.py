"""The same GPT in PyTorch, the reference every benchmark compares with.

It mirrors models/gpt.py layer for layer (pre-norm blocks, LayerNorm without bias, tanh GELU,
tied output embedding, causal scaled-dot-product attention) and takes its weights from a
microtensor GPT, so both compute the same function and a benchmark can check that their losses
agree before it times them. It is written the way a PyTorch user would write it: nn.Linear,
F.scaled_dot_product_attention, torch.optim.AdamW, clip_grad_norm_.

Only the default options are mirrored (layernorm, gelu, learned positions); the benchmarks use
the default recipe.
"""
import numpy as np


def build(torch, config):
    """A PyTorch GPT class for `config` (models.gpt.GPTConfig); torch is passed in so that this
    module imports without it."""
    nn, F = torch.nn, torch.nn.functional
    if (config.norm, config.mlp, config.pos) != ("layernorm", "gelu", "learned") or not config.tie_weights:
        raise ValueError("torch_gpt mirrors the default GPT only (layernorm, gelu, learned positions, tied weights)")

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_head = config.n_head
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

        def forward(self, x, cache=None):
            B, T, C = x.shape
            H = self.n_head
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, offset + T, D)
            y = _causal_attention(torch, q, k, v)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.attn = SelfAttention()
            self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

        def forward(self, x, cache=None):
            x = x + self.attn(self.ln_1(x), cache)
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class TorchGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = config
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
            self.h = nn.ModuleList([Block() for _ in range(config.n_layer)])
            self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)

        def forward(self, idx, targets=None, caches=None, offset=0):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(offset, offset + T))
            for layer, block in enumerate(self.h):
                x = block(x, None if caches is None else caches[layer])
            logits = self.ln_f(x) @ self.wte.weight.T
            loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
            return logits, loss

        def new_caches(self, batch):
            D = config.n_embd // config.n_head
            return [KVCache(torch, batch, config.n_head, config.block_size, D) for _ in range(config.n_layer)]

    return TorchGPT


def _causal_attention(torch, q, k, v):
    """Queries (B, H, Tq, D) that are the last Tq of Tk positions: query i sees keys up to Tk - Tq + i."""
    Tq, Tk = q.shape[2], k.shape[2]
    if Tq == Tk:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    if Tq == 1:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)  # the newest token sees every key
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class KVCache:
    """Preallocated keys and values (B, H, block_size, D) and a write position, as in models/gpt.py."""

    def __init__(self, torch, batch, n_head, block_size, head_size):
        self.k = torch.zeros(batch, n_head, block_size, head_size)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def append(self, k, v):
        T = k.shape[2]
        self.k[:, :, self.length : self.length + T] = k
        self.v[:, :, self.length : self.length + T] = v
        self.length += T
        return self.k[:, :, : self.length], self.v[:, :, : self.length]


def from_arrays(torch, config, arrays):
    """A PyTorch GPT holding exactly the weights in `arrays`, a dict of a microtensor GPT's
    parameters by name (model.state_dict()). nn.Linear stores its weight as (out, in) where
    microtensor's is (in, out), so those are transposed."""
    TorchGPT = build(torch, config)
    theirs = TorchGPT()
    mapping = {"wte.weight": "transformer.wte.weight", "wpe.weight": "transformer.wpe.weight", "ln_f.weight": "transformer.ln_f.weight"}
    if config.bias:
        mapping["ln_f.bias"] = "transformer.ln_f.bias"
    for name, _ in theirs.named_parameters():
        if name.startswith("h."):
            layer, rest = name[2:].split(".", 1)
            ours_rest = rest if not rest.startswith("c_") else "mlp." + rest
            mapping[name] = f"transformer.h.{layer}.{ours_rest}"
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            array = np.asarray(arrays[mapping[name]])
            if array.ndim == 2 and not name.endswith(("wte.weight", "wpe.weight")):
                array = array.T  # Linear: (in, out) -> (out, in)
            if tuple(array.shape) != tuple(p.shape):
                raise ValueError(f"from_arrays: {name} is {tuple(p.shape)} but {mapping[name]} is {array.shape}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(array)))
    return theirs


def from_microtensor(torch, model):
    """A PyTorch GPT with the weights of a microtensor GPT (in the same process)."""
    return from_arrays(torch, model.config, {name: p.data for name, p in model.named_parameters()})


def float_inputs(seed, shapes):
    """float32 standard-normal arrays of these shapes: the same in every process for one seed."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def integer_inputs(seed, high, shape):
    """Integer ids in [0, high): the same in every process for one seed."""
    return np.random.default_rng(seed).integers(0, high, shape)


def random_batch(rng, batch_size, block_size, vocab_size):
    """Inputs and next-token targets (B, T), from the generator's next draw."""
    x = rng.integers(0, vocab_size, (batch_size, block_size + 1))
    return np.ascontiguousarray(x[:, :-1]), np.ascontiguousarray(x[:, 1:])


def adamw(torch, model, lr, weight_decay, betas):
    """AdamW with decay on matrices only, as microtensor.optim.weight_decay_groups does."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def matmul_flops_per_token(config):
    """Multiply-adds ×2 of one token's forward pass through every matmul (Linear layers, QKᵀ and PV
    over the whole causal block as computed, and the output layer)."""
    C, L, T, V = config.n_embd, config.n_layer, config.block_size, config.vocab_size
    linear = 2 * (C * 3 * C + C * C + C * 4 * C + 4 * C * C)  # c_attn, attn c_proj, c_fc, mlp c_proj
    attention = 2 * 2 * T * C  # QKᵀ and PV: T keys × C (= H × D) per query
    return L * (linear + attention) + 2 * C * V

