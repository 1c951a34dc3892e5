"""A small GPT, built only from microtensor ops and modules, with nanoGPT's parameter names.

    idx (B, T) -> wte(idx) [+ wpe(positions)] -> n_layer × Block -> ln_f -> logits (B, T, V)
    Block:  x = x + attn(norm_1(x));  x = x + mlp(norm_2(x))          (pre-norm, residual stream)

Every gradient flows through ops whose backward is hand-written and gradient-checked: there is no
numpy math in the forward pass. Options (`GPTConfig`), each explained in docs/:
- norm: LayerNorm or RMSNorm; mlp: GELU, SwiGLU, or a mixture of experts ("moe": n_expert GELU
  MLPs, each token routed to expert_top_k of them, with a load-balancing loss, gpt/model/electives/moe.py);
- pos: learned positions (a table of block_size rows), rotary ("rope", applied to q and k),
  sinusoidal (a fixed sin/cos table added to the embeddings) or ALiBi (a per-head penalty on the
  scores that grows with distance, no table at all); all but learned can run past block_size;
- n_kv_head: key/value heads shared by groups of query heads (1 is multi-query attention);
- attention: the standard kernel, which keeps the (T, T) probabilities for backward, or "online",
  FlashAttention's tiles with a running max and sum, which keeps only one number per row; or
  "latent", keys and values made from a small cached latent (gpt/model/electives/latent_attention.py);
- biases, and tied input/output embeddings (logits = x @ wteᵀ, so `lm_head.weight` exists only
  when untied);
- checkpoint_activations: each block runs under `mt.checkpoint`, which keeps only its input for
  backward and runs the block again there (microtensor/ops/electives/checkpointing.py);
- mixer: attention, or a selective state-space model ("ssm", gpt/model/electives/ssm.py), whose
  scan carries a state of fixed size from token to token and needs no position encoding (`pos` none);
- mtp: n - 1 extra heads on the blocks' output predict the tokens 2 .. n places ahead, and the loss
  adds their cross-entropies (gpt/model/electives/mtp.py); `trunk` and `logits_of` are the two
  halves of `forward` they hook into.
The options combine freely, but for checkpointing with experts (their load-balancing loss needs
the block's graph).

Generation (`generate`, `generate_tokens`) samples over a Decoder (gpt/generation/sampling.py,
gpt/generation/decoder.py), which keeps each layer's keys and values in a `KVCache` (below; a state of
fixed size in an `SSMCache` with `mixer` ssm, gpt/model/electives/ssm.py) so that a new
token costs one token's work, and applies the context window rule past block_size. With caches,
`forward` takes the new tokens at positions offset .. offset + T - 1 of the window.

Every argument is checked before any kernel runs (`GPTConfig`'s fields, the token ids against the
vocabulary, the caches' positions): the kernels index without bounds checks, so an id outside the
vocabulary would otherwise read outside the embedding table.
"""
import difflib
import math
from dataclasses import asdict, dataclass, field, fields

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import InputError, InputTypeError, nn
from microtensor.checks import is_integer, is_real_number
from microtensor.nn import sinusoidal_embedding

from gpt.generation.decoder import check_generation_options, check_ids, check_prompt
from gpt.generation.sampling import sampled_tokens


class ConfigError(InputError):
    """A GPTConfig field whose value cannot work. Besides its message, it carries the field, the
    value given and what was expected, in words where `name` (in backquotes) is another field, so
    that a program can say the same with its own names: train.py writes "--n-embd: given 15,
    expected a multiple of --n-head (2)"."""

    def __init__(self, message, field, given, expected):
        super().__init__(f"GPTConfig: {message}")
        self.field, self.given, self.expected = field, given, expected


def option(default, help, **metadata):
    """A GPTConfig field with its help text (train.py makes a flag of it, with this help), and its
    choices when it takes one of a few names; only_with: the (field, value) it means something beside."""
    return field(default=default, metadata={"help": help, **metadata})


POSITION_SCHEMES = ("learned", "rope", "sinusoidal", "alibi")


@dataclass
class GPTConfig:
    """The model's options, each with its help text (`option`): train.py's model flags are made from
    these fields, and their values are checked here alone. In the help and the expected texts of
    the errors, `name` is another field (train.py prints it as a flag, --name)."""

    vocab_size: int  # the tokenizer's, so no flag of its own
    block_size: int = option(64, "context length in tokens")
    n_layer: int = option(4, "transformer blocks")
    n_head: int = option(4, "attention heads per block")
    n_embd: int = option(128, "embedding width (divisible by `n_head`)")
    dropout: float = option(0.0, "dropout probability")
    bias: bool = option(False, "biases in Linear and LayerNorm layers")
    norm: str = option("layernorm", "normalization layer", choices=("layernorm", "rmsnorm"))
    mlp: str = option("gelu", "MLP kind: moe is a mixture of `n_expert` GELU MLPs (docs/electives/moe.md)", choices=("gelu", "swiglu", "moe"))
    pos: str = option(
        "auto", "position encoding: a learned table, rotary, a fixed sinusoidal table, or ALiBi's distance penalty (docs/electives/positions.md); "
        "none, only with `mixer` ssm, whose scan reads the tokens in order (auto: learned, or none with `mixer` ssm)",
        choices=POSITION_SCHEMES + ("none",),
    )  # fmt: skip
    tie_weights: bool = option(True, "a separate output layer instead of reusing the token embedding")  # the flag says "no"
    n_kv_head: int | None = option(
        None, "key/value heads, dividing `n_head`: 1 is multi-query, fewer than `n_head` grouped-query attention "
        "(default: `n_head`, multi-head; docs/electives/grouped-query-attention.md)",
    )  # fmt: skip
    attention: str = option(
        "standard", "attention kernel: standard keeps the (T, T) probabilities for backward; online (FlashAttention's "
        "tiles) keeps one number per row (docs/electives/online-attention.md); latent caches one small vector per "
        "token, from which keys and values are made (docs/electives/latent-attention.md)", choices=("standard", "online", "latent"),
    )  # fmt: skip
    mixer: str = option(
        "attention", "how a block mixes tokens: attention, or a selective state-space model whose state per layer has "
        "a fixed size (docs/electives/state-space-models.md)", choices=("attention", "ssm"),
    )  # fmt: skip
    d_state: int = option(16, "numbers of state per channel of `mixer` ssm", only_with=("mixer", "ssm"))
    d_conv: int = option(4, "taps of the causal convolution before the scan, with `mixer` ssm", only_with=("mixer", "ssm"))
    ssm_expand: int = option(2, "the SSM's inner width, in multiples of `n_embd`, with `mixer` ssm", only_with=("mixer", "ssm"))
    checkpoint_activations: bool = option(
        False, "keep only each block's input for backward and compute the rest again there: less memory, one more "
        "forward per block; the weights and the numbers are the same (docs/electives/checkpointing.md)",
    )  # fmt: skip
    mtp: int = option(
        1, "tokens each position predicts: n - 1 extra heads predict the tokens 2 .. n places ahead, and the loss "
        "sums their cross-entropies (1: next-token prediction alone; docs/electives/multi-token-prediction.md)",
    )  # fmt: skip
    mtp_weights: str | None = option(
        None, "the loss's weight of each of the `mtp` heads, comma-separated, the next-token head's first "
        "(e.g. 1,0.5,0.25 with `mtp` 3; unset: 1 each, the plain sum)",
    )  # fmt: skip
    kv_latent: int | None = option(
        None, "numbers per token of the latent that `attention` latent caches, at most `n_embd` (default: `n_embd` / 4)",
        only_with=("attention", "latent"),
    )  # fmt: skip
    rope_head_dim: int | None = option(
        None, "size of the rotary key shared by the heads beside the latent, even, with `attention` latent and `pos` "
        "rope (default: half the head size, rounded down to even)", only_with=("attention", "latent"),
    )  # fmt: skip
    n_expert: int = option(4, "experts of `mlp` moe", only_with=("mlp", "moe"))
    expert_top_k: int = option(2, "experts each token is routed to, with `mlp` moe (at most `n_expert`)", only_with=("mlp", "moe"))

    def __new__(cls, *args, **kwargs):
        """Refuse a field GPTConfig does not have by name, with the closest known one (n_layers ->
        n_layer), before the dataclass's __init__ would raise Python's bare TypeError."""
        known = [f.name for f in fields(cls)]
        for name in kwargs:
            if name not in known:
                closest = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {closest[0]}?" if closest else "no field is close"
                raise InputTypeError(f"GPTConfig: unknown field {name!r} ({hint}); expected one of {', '.join(known)}")
        return super().__new__(cls)

    def __post_init__(self):
        """Check every field, types first (a float size or a string flag is refused, not rounded or
        read as true); numpy integers become Python ints, so that `to_dict()` is plain JSON. A
        value of the right type that cannot work is a ConfigError."""
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head if is_integer(self.n_head) else None
        if self.pos == "auto":  # the default: what each mixer needs
            self.pos = "none" if self.mixer == "ssm" else "learned"
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "n_kv_head", "n_expert", "expert_top_k", "mtp", "d_state", "d_conv", "ssm_expand"):
            value = getattr(self, name)
            if not is_integer(value):
                raise InputTypeError(f"GPTConfig: {name} must be an int, got {type(value).__name__} {value!r}")
            expected = f"an integer >= 1 dividing `n_head` ({self.n_head})" if name == "n_kv_head" else "an integer >= 1"
            _require(value >= 1, f"{name} must be a positive integer, got {value}", name, value, expected)
            setattr(self, name, int(value))
        for name in ("bias", "tie_weights", "checkpoint_activations"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise InputTypeError(f"GPTConfig: {name} must be True or False, got {type(value).__name__} {value!r}")
            setattr(self, name, bool(value))
        if not is_real_number(self.dropout):
            raise InputTypeError(f"GPTConfig: dropout must be a number, got {type(self.dropout).__name__} {self.dropout!r}")
        _require(0 <= self.dropout < 1, f"dropout must be in [0, 1), got {self.dropout}", "dropout", self.dropout, "a number in [0, 1)")
        self.dropout = float(self.dropout)
        for option_field in fields(self):
            allowed, value = option_field.metadata.get("choices"), getattr(self, option_field.name)
            if allowed is not None and not (isinstance(value, str) and value in allowed):
                error = InputError if isinstance(value, str) else InputTypeError
                got = repr(value) if isinstance(value, str) else f"{type(value).__name__} {value!r}"
                raise error(f"GPTConfig: {option_field.name} must be one of {allowed}, got {got}")
        _require(
            self.mtp <= self.block_size, f"mtp ({self.mtp}) must be at most block_size ({self.block_size}): head k learns "
            "from the positions that have a token k places ahead inside the block", "mtp", self.mtp, "at most `block_size` "
            f"({self.block_size}): the furthest head needs a target inside the block",
        )  # fmt: skip
        if self.mtp_weights is not None:
            from gpt.model.electives.mtp import parse_weights

            if not isinstance(self.mtp_weights, str):
                raise InputTypeError(f"GPTConfig: mtp_weights must be None or a string of numbers, got {type(self.mtp_weights).__name__} {self.mtp_weights!r}")
            try:
                parse_weights(self.mtp_weights, self.mtp)
            except InputError as error:
                raise ConfigError(
                    str(error), "mtp_weights", self.mtp_weights, f"{self.mtp} comma-separated number{'s' if self.mtp > 1 else ''} >= 0, not all zero: one weight per head of `mtp` ({self.mtp})",
                ) from None  # fmt: skip
        n_embd, n_head = self.n_embd, self.n_head
        _require(
            n_embd % n_head == 0, f"n_embd ({n_embd}) must be divisible by n_head ({n_head})",
            "n_embd", n_embd, f"a multiple of `n_head` ({n_head})",
        )  # fmt: skip
        _require(
            n_head % self.n_kv_head == 0, f"n_kv_head ({self.n_kv_head}) must divide n_head ({n_head}): each key/value "
            "head serves a group of n_head / n_kv_head query heads",
            "n_kv_head", self.n_kv_head, f"an integer >= 1 dividing `n_head` ({n_head})",
        )  # fmt: skip
        _require(
            self.expert_top_k <= self.n_expert, f"expert_top_k ({self.expert_top_k}) must be at most n_expert "
            f"({self.n_expert}): a token cannot be routed to more experts than there are", "expert_top_k", self.expert_top_k,
            f"at most `n_expert` ({self.n_expert}): a token goes to that many different experts",
        )  # fmt: skip
        _require(
            not (self.checkpoint_activations and self.mlp == "moe"), "checkpoint_activations cannot run with mlp moe: "
            "its load-balancing loss is made inside the block, where a checkpointed forward records no graph",
            "checkpoint_activations", self.checkpoint_activations, "no `mlp` moe (its load-balancing loss needs the block's graph)",
        )  # fmt: skip
        if self.mixer == "ssm":
            self._check_ssm()
        _require(
            self.pos != "none" or self.mixer == "ssm", "pos none needs mixer ssm: attention sees its keys as a set, and "
            "takes their order from the position encoding", "pos", self.pos, "learned, rope, sinusoidal or alibi (none only with `mixer` ssm)",
        )  # fmt: skip
        head_size = n_embd // n_head
        _require(
            self.pos != "rope" or head_size % 2 == 0, f"rope needs an even head size, got {head_size}", "n_embd", n_embd,
            f"with `pos` rope, an even size per head (`n_embd` / `n_head` is {head_size})",
        )  # fmt: skip
        _require(
            self.pos != "sinusoidal" or n_embd % 2 == 0,
            f"sinusoidal positions pair a sine and a cosine, so n_embd must be even, got {n_embd}",
            "n_embd", n_embd, "with `pos` sinusoidal, an even width (each sine has its cosine)",
        )  # fmt: skip
        if self.attention == "latent":
            from gpt.model.electives.latent_attention import check_latent_config

            check_latent_config(self)  # kv_latent, rope_head_dim and n_kv_head: their defaults and checks

    def _check_ssm(self):
        """`mixer` ssm has no attention: the options that only attention has are refused, not ignored."""
        _require(
            self.n_kv_head == self.n_head, f"n_kv_head ({self.n_kv_head}) is attention's; mixer ssm has no keys or values",
            "n_kv_head", self.n_kv_head, "no `n_kv_head` with `mixer` ssm (it has no attention heads)",
        )  # fmt: skip
        _require(
            self.attention == "standard", f"attention {self.attention} is attention's kernel; mixer ssm has no attention",
            "attention", self.attention, "no `attention` with `mixer` ssm (it has no attention)",
        )  # fmt: skip
        _require(
            self.pos in ("none", "learned", "sinusoidal"), f"pos {self.pos} acts inside attention; mixer ssm has none",
            "pos", self.pos, "none (the default with `mixer` ssm), or learned or sinusoidal (added to the embeddings)",
        )  # fmt: skip

    def to_dict(self):
        return asdict(self)


def _require(ok, message, name, given, expected):
    """A ConfigError on field `name` unless ok (message: for GPTConfig's callers; expected: for a program's)."""
    if not ok:
        raise ConfigError(message, name, given, expected)


def mlp_width(config):
    """The hidden width of a dense MLP: 4C for GELU; round(8C/3) up to a multiple of 8 for SwiGLU,
    which has three matrices instead of two, so that the parameter count stays that of GELU's."""
    C = config.n_embd
    return 4 * C if config.mlp != "swiglu" else 8 * math.ceil(8 * C / 3 / 8)


def parameter_count(config):
    """How many numbers GPT(config) learns, from the config alone: a model too large for the memory
    cannot be built to be counted. Equal to GPT(config).num_parameters() (a test checks it)."""
    C, V, H, Hk = config.n_embd, config.vocab_size, config.n_head, config.n_kv_head
    bias = 1 if config.bias else 0
    qkv = (H + 2 * Hk) * (C // H)  # c_attn's output width
    norm = 2 * C if config.norm == "layernorm" and config.bias else C  # weight (and bias)
    attention = C * qkv + bias * qkv + C * C + bias * C  # c_attn, c_proj
    if config.attention == "latent":
        from gpt.model.electives import latent_attention

        attention = latent_attention.parameter_count(config)  # c_q, kv_down, k_up, v_up, c_proj
    hidden = mlp_width(config)
    gelu_mlp = C * hidden + bias * hidden + hidden * C + bias * C  # c_fc, c_proj
    if config.mlp == "swiglu":
        mlp = gelu_mlp + C * hidden + bias * hidden  # and c_up
    elif config.mlp == "moe":
        mlp = C * config.n_expert + config.n_expert * gelu_mlp  # the router (no bias) and the experts
    else:
        mlp = gelu_mlp
    if config.mixer == "ssm":
        from gpt.model.electives.ssm import ssm_parameter_count

        attention = ssm_parameter_count(config)
    total = V * C + config.n_layer * (2 * norm + attention + mlp) + norm  # wte, the blocks, ln_f
    if config.pos == "learned":
        total += config.block_size * C  # wpe
    if not config.tie_weights:
        total += C * V  # lm_head
    head_mlp = mlp if config.mlp == "swiglu" else gelu_mlp  # an extra head's MLP is dense, even beside experts
    total += (config.mtp - 1) * (norm + head_mlp)  # the extra heads of mtp: a norm and an MLP each
    return total


def training_step_bytes(config, batch_size, itemsize=4, trains_every_weight=True):
    """A lower bound on the memory one training step of GPT(config) needs on batch_size sequences of
    block_size tokens, in bytes, by part: {"weights", "activations", "total"}. It is what must
    exist at once at the end of the forward and the start of backward:

    weights      the parameters, and for each one its gradient and AdamW's two moments: 4 numbers
                 per parameter (with LoRA, trains_every_weight=False: the frozen weights alone)
    activations  per token, the arrays the graph keeps for backward (each op's output that a later
                 op takes, and what an op saves besides), counted from the forward:
                   the embedding (C), with positions added (C), and per block:
                     ln_1 (C), qkv ((H + 2 Hk) D), attention's probabilities (H T: a row of (T, T)
                     per head; "online" keeps one number per row, H), its output (C), c_proj (C),
                     the residual sum (C), ln_2 (C), the MLP's hidden layers, c_proj (C), the sum (C)
                   then ln_f (C), the logits and cross-entropy's saved exponentials (2 V), and in
                   backward the logits' gradient (V), and the two int64 id arrays of the batch.
                 Dropout's masks and the small per-row statistics are left out: a lower bound.
                 With checkpoint_activations the graph keeps each block's input alone (C), and
                 backward runs one block again at a time: n_layer C + one block's arrays (or the
                 head's, whichever is larger) instead of n_layer blocks' arrays.
                 With mtp n, extra head k adds, at each of the T - k + 1 positions that have
                 its target, its norm (C), its MLP's hidden layers, its output and the sum
                 (2C), ln_f (C), and its logits, saved exponentials and their gradient (3V).

    itemsize: bytes per number (4 for float32, 8 for float64).
    """
    C, V, T, H, Hk = config.n_embd, config.vocab_size, config.block_size, config.n_head, config.n_kv_head
    hidden = mlp_width(config)
    if config.mlp == "gelu":
        mlp = 2 * hidden  # c_fc's output and GELU's
    elif config.mlp == "swiglu":
        mlp = 3 * hidden  # c_fc's, c_up's, SwiGLU's
    else:  # the router's logits and probabilities; per routed copy its row, two hidden layers and
        # the expert's answer; each expert's (N, C) contribution, and the running sums but the last
        # (the MLP's output, counted below as c_proj's)
        k, E = config.expert_top_k, config.n_expert
        mlp = 2 * E + k * (2 * C + 2 * hidden) + (2 * E - 2) * C
    attention_rows = H * T if config.attention != "online" else H
    qkv = (H + 2 * Hk) * (C // H)
    if config.attention == "latent":
        from gpt.model.electives import latent_attention

        qkv = latent_attention.activation_numbers(config)  # the queries, the latent, the keys and values made from it
    per_block = 7 * C + qkv + attention_rows + mlp
    if config.mixer == "ssm":  # in place of qkv, the probabilities and attention's output: gpt/model/electives/ssm.py
        from gpt.model.electives.ssm import ssm_activations_per_token

        per_block = 6 * C + ssm_activations_per_token(config) + mlp
    positions = C if config.pos in ("learned", "sinusoidal") else 0
    if config.checkpoint_activations:
        per_token = C + positions + config.n_layer * C + max(per_block, C + 3 * V)
    else:
        per_token = C + positions + config.n_layer * per_block + C + 3 * V
    head_mlp = (3 if config.mlp == "swiglu" else 2) * hidden  # an extra head's MLP is dense, even beside experts
    head_rows = sum(max(0, T - k + 1) for k in range(2, config.mtp + 1))  # per sequence, over the extra heads
    tokens = batch_size * T
    parameters = parameter_count(config)
    weights = parameters * itemsize * (4 if trains_every_weight else 1)
    heads = batch_size * head_rows * (4 * C + head_mlp + 3 * V)
    activations = (tokens * per_token + heads) * itemsize + tokens * 2 * 8
    return {"weights": weights, "activations": activations, "total": weights + activations}


def _norm(config, dtype):
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, dtype=dtype)
    return nn.LayerNorm(config.n_embd, bias=config.bias, dtype=dtype)


class KVCache:
    """One layer's keys and values for generation: (B, Hk, block_size, D) arrays and a write position,
    Hk = n_kv_head (grouped-query attention stores only the shared heads). GPT.new_caches makes them
    views of two arrays (n_layer, B, Hk, block_size, D), which the fast set's decode kernel takes whole."""

    def __init__(self, k, v):
        self.k, self.v = k, v  # each (B, Hk, block_size, D)
        self.length = 0  # how many positions hold keys and values

    def append(self, k, v):
        """Write the new keys and values (B, Hk, T, D); return all of them so far as tensors."""
        T = k.shape[2]
        if self.length + T > self.k.shape[2]:
            raise InputError(
                f"KVCache: {T} new positions after {self.length} do not fit a cache of {self.k.shape[2]} positions"
            )
        self.k[:, :, self.length : self.length + T] = k.data
        self.v[:, :, self.length : self.length + T] = v.data
        self.length += T
        return mt.Tensor(self.k[:, :, : self.length]), mt.Tensor(self.v[:, :, : self.length])


class CausalSelfAttention(nn.Module):
    """n_head query heads over n_kv_head key/value heads (grouped-query attention: each key/value head
    serves n_head / n_kv_head query heads; multi-head when they are equal). One Linear layer makes the
    queries, keys and values side by side: qkv (B, T, (H + 2 Hk) D)."""

    def __init__(self, config, dtype):
        super().__init__()
        self.n_head, self.n_kv_head, self.pos = config.n_head, config.n_kv_head, config.pos
        head_size = config.n_embd // config.n_head
        width = (config.n_head + 2 * config.n_kv_head) * head_size
        self.c_attn = nn.Linear(config.n_embd, width, bias=config.bias, dtype=dtype)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias, dtype=dtype)
        self.resid_dropout = nn.Dropout(config.dropout)
        # ALiBi's per-head slopes: a constant, not a parameter (None: no bias on the scores)
        self.alibi_slopes = F.alibi_slopes(config.n_head).astype(dtype) if config.pos == "alibi" else None
        if config.attention == "online":
            self.attend, self.attend_packed = F.online_attention, F.multi_head_online_attention
        else:
            self.attend, self.attend_packed = F.scaled_dot_product_attention, F.multi_head_attention

    def forward(self, x, cache=None, offset=0):
        B, T, C = x.shape
        H, Hk = self.n_head, self.n_kv_head
        qkv = self.c_attn(x)  # (B, T, (H + 2 Hk) D)
        if cache is None and self.pos != "rope":
            # training: split into heads, attend, merge, all in one op (equal to the steps below)
            y = self.attend_packed(qkv, H, n_kv_head=Hk, alibi_slopes=self.alibi_slopes)  # (B, T, C)
            return self.resid_dropout(self.c_proj(y))
        heads = qkv.reshape(B, T, H + 2 * Hk, C // H).permute(0, 2, 1, 3)  # (B, H + 2 Hk, T, D)
        q, k, v = heads[:, :H], heads[:, H : H + Hk], heads[:, H + Hk :]  # (B, H, T, D), (B, Hk, T, D) twice
        if self.pos == "rope":
            q, k = F.rope(q, offset), F.rope(k, offset)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, Hk, offset + T, D): the queries are the last T positions
        y = self.attend(q, k, v, causal=True, alibi_slopes=self.alibi_slopes)  # (B, H, T, D)
        y = y.permute(0, 2, 1, 3).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """GELU: c_proj(gelu(c_fc(x))), hidden 4C. SwiGLU: c_proj(swiglu(c_fc(x), c_up(x))) with hidden
    width round(8C/3) to a multiple of 8, which keeps the parameter count of the GELU MLP."""

    def __init__(self, config, dtype):
        super().__init__()
        self.kind = config.mlp
        C = config.n_embd
        hidden = mlp_width(config)
        self.c_fc = nn.Linear(C, hidden, bias=config.bias, dtype=dtype)
        if config.mlp == "swiglu":
            self.c_up = nn.Linear(C, hidden, bias=config.bias, dtype=dtype)
        self.c_proj = nn.Linear(hidden, C, bias=config.bias, dtype=dtype)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        if self.kind == "swiglu":
            h = F.swiglu(self.c_fc(x), self.c_up(x))
        else:
            h = F.gelu(self.c_fc(x), approximate="tanh")
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = _norm(config, dtype)
        self.mixer = config.mixer
        if config.mixer == "ssm":
            from gpt.model.electives.ssm import SelectiveSSM

            self.ssm = SelectiveSSM(config, dtype)  # in place of attention (gpt/model/electives/ssm.py)
        elif config.attention == "latent":
            from gpt.model.electives.latent_attention import LatentAttention

            self.attn = LatentAttention(config, dtype)  # keys and values made from a cached latent
        else:
            self.attn = CausalSelfAttention(config, dtype)
        self.ln_2 = _norm(config, dtype)
        if config.mlp == "moe":
            from gpt.model.electives.moe import MixtureOfExperts

            hidden = 4 * config.n_embd  # each expert is as wide as the dense GELU MLP
            self.mlp = MixtureOfExperts(
                config.n_embd, config.n_expert, config.expert_top_k, hidden, config.bias, dtype, dropout=config.dropout
            )
        else:
            self.mlp = MLP(config, dtype)

    def forward(self, x, cache=None, offset=0):
        mix = self.ssm if self.mixer == "ssm" else self.attn
        x = x + mix(self.ln_1(x), cache, offset)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config, dtype=mt.float32):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise InputTypeError(f"GPT: expected a GPTConfig, got {type(config).__name__}")
        self.config = config
        parts = {"wte": nn.Embedding(config.vocab_size, config.n_embd, dtype=dtype)}
        if config.pos == "learned":
            parts["wpe"] = nn.Embedding(config.block_size, config.n_embd, dtype=dtype)
        parts["drop"] = nn.Dropout(config.dropout)
        parts["h"] = nn.ModuleList([Block(config, dtype) for _ in range(config.n_layer)])
        parts["ln_f"] = _norm(config, dtype)
        self.transformer = nn.ModuleDict(parts)
        if not config.tie_weights:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, dtype=dtype)
        self.head_losses = None  # with mtp > 1, after a forward with targets: each head's loss
        if config.mtp > 1:
            from gpt.model.electives.mtp import extra_heads

            self.mtp_heads = extra_heads(config, dtype)  # heads 2 .. mtp (gpt/model/electives/mtp.py)
        self._init_weights()

    def _init_weights(self):
        """GPT-2's: weights N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)) (each block
        adds two of them to the residual stream), biases 0, norm weights 1."""
        rng = mt.get_generator()
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.data[...] = 0
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                p.data[...] = 1
            else:
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj.weight") else 0.02
                p.data[...] = rng.normal(0.0, std, p.shape)
        if self.config.mixer == "ssm":  # its own choices for A, D, Δ's projection, the convolution, out_proj
            for block in self.transformer.h:
                block.ssm.reset_parameters(rng, self.config.n_layer)

    def forward(self, idx, targets=None, caches=None, offset=0):
        """idx (B, T) int -> (logits (B, T, V), loss or None). With caches, idx holds the tokens at
        positions offset .. offset + T - 1 of the window, and their keys and values are appended.
        With mtp > 1 the loss adds the extra heads' (gpt/model/electives/mtp.py); the logits are the next-token head's."""
        x = self.trunk(idx, caches, offset)
        logits = self.logits_of(x)
        loss = None if targets is None else F.cross_entropy(logits, targets)
        if loss is not None and self.config.mtp > 1:
            from gpt.model.electives.mtp import multi_token_loss

            loss, self.head_losses = multi_token_loss(self, x, loss, targets)
        return logits, loss

    def trunk(self, idx, caches=None, offset=0):
        """idx (B, T) int -> the last block's output (B, T, C), before ln_f: what every head reads."""
        if not isinstance(idx, mt.Tensor):
            idx = np.asarray(idx)
            if idx.dtype.kind not in "iu":  # before mt.tensor, which would take floats or strings
                raise InputError(f"GPT: idx must be an integer tensor (B, T), got {idx.dtype} of shape {idx.shape}")
            idx = mt.tensor(idx)
        if idx.ndim != 2 or idx.dtype.kind not in "iu":
            raise InputError(f"GPT: idx must be an integer tensor (B, T), got {idx.dtype} of shape {idx.shape}")
        B, T = idx.shape
        check_ids("GPT", idx.data, self.config.vocab_size)
        if not is_integer(offset) or offset < 0:
            raise InputError(f"GPT: offset must be an int >= 0, got {offset!r}")
        if offset + T > self.config.block_size and (self.config.pos == "learned" or caches is not None):
            # rope, sinusoidal and alibi compute positions on the fly, so a forward without caches may go
            # past block_size (to measure how a model extrapolates); a learned table has no such rows
            raise InputError(
                f"GPT: a sequence of {offset + T} tokens is longer than block_size {self.config.block_size}"
                + (" (the learned position table has block_size rows)" if self.config.pos == "learned" else "")
            )
        if caches is not None:
            self._check_caches(caches, B, offset)
        x = self.transformer.wte(idx)  # (B, T, C)
        if self.config.pos == "learned":
            x = x + self.transformer.wpe(mt.arange(offset, offset + T))
        elif self.config.pos == "sinusoidal":
            x = x + mt.tensor(sinusoidal_embedding(offset, T, self.config.n_embd, x.dtype))  # (T, C), a constant
        x = self.transformer.drop(x)
        for layer, block in enumerate(self.transformer.h):
            if self.config.checkpoint_activations and caches is None:
                x = mt.checkpoint(block, x, None, offset)  # keeps x alone; backward runs the block again
            else:
                x = block(x, None if caches is None else caches[layer], offset)
        return x

    def logits_of(self, x):
        """The trunk's output (B, T, C) -> logits (B, T, V): ln_f, then the unembedding."""
        x = self.transformer.ln_f(x)
        if self.config.tie_weights:
            wte = self.transformer.wte
            # a quantized table (gpt/model/electives/quantize.py) computes x @ wteᵀ from its codes: there is no float weight
            logits = x @ wte.weight.T if isinstance(wte, nn.Embedding) else wte.tied_head(x)  # (B, T, C) @ (C, V)
        else:
            logits = self.lm_head(x)
        return logits

    def moe_aux_loss(self):
        """The sum over blocks of the mixture-of-experts load-balancing loss of the last forward (a
        Tensor; add it to the loss with a coefficient), or None when the MLPs are not experts."""
        from gpt.model.electives.moe import total_aux_loss

        return total_aux_loss(self)

    def tokens_per_expert(self):
        """(n_layer, n_expert) ints: how many tokens each block routed to each expert in the last forward."""
        if self.config.mlp != "moe":
            raise InputError("GPT.tokens_per_expert: this model has no experts (mlp is not 'moe')")
        return np.stack([block.mlp.tokens_per_expert for block in self.transformer.h])

    def kv_cache_bytes_per_token(self):
        """Bytes of keys and values the cache keeps for each token: 2 · n_layer · n_kv_head · D numbers
        (latent attention: n_layer · (kv_latent + rope_head_dim), the latent and the rotary key; 0 with
        `mixer` ssm, whose state has one size at every length: gpt/model/electives/ssm.py, state_bytes)."""
        c = self.config
        if c.mixer == "ssm":
            return 0
        if c.attention == "latent":
            from gpt.model.electives.latent_attention import cache_numbers_per_token

            return c.n_layer * cache_numbers_per_token(c) * self.transformer.wte.weight.dtype.itemsize
        return 2 * c.n_layer * c.n_kv_head * (c.n_embd // c.n_head) * self.transformer.wte.weight.dtype.itemsize

    def _check_caches(self, caches, batch, offset):
        """The caches a forward appends to: one KVCache per layer, for this batch, holding exactly the
        `offset` positions before the new tokens (else the new keys would land at other positions
        than the ones their queries are given)."""
        c = self.config
        if c.mixer == "ssm":
            from gpt.model.electives.ssm import check_caches

            return check_caches(self, caches, batch, offset)
        if c.attention == "latent":
            from gpt.model.electives.latent_attention import check_latent_caches

            return check_latent_caches(self, caches, batch, offset)
        if not isinstance(caches, (list, tuple)) or len(caches) != c.n_layer or not all(isinstance(x, KVCache) for x in caches):
            raise InputTypeError(f"GPT: caches must be a list of {c.n_layer} KVCaches (from new_caches), got {caches!r:.80}")
        shape = (batch, c.n_kv_head, None, c.n_embd // c.n_head)
        for layer, cache in enumerate(caches):
            k_shape = cache.k.shape
            if cache.k.ndim != 4 or (k_shape[0], k_shape[1], k_shape[3]) != (batch, c.n_kv_head, c.n_embd // c.n_head) or cache.v.shape != k_shape:
                raise InputError(f"GPT: the cache of layer {layer} holds keys {k_shape} and values {cache.v.shape}, expected {shape}")
            if cache.length != offset:
                raise InputError(
                    f"GPT: offset is {offset}, but the cache of layer {layer} holds {cache.length} positions; "
                    "the new tokens' positions must start where the cache ends"
                )

    # ------------------------------------------------------------------------------ generation

    def new_cache_arrays(self, batch):
        """Zeroed keys and values of every layer: two arrays (n_layer, B, Hk, block_size, D), Hk = n_kv_head.
        A model whose blocks keep other state for generation returns None here, and its `new_caches`
        gives each layer a cache of its own kind: an object with `length` (the positions it holds,
        which the Decoder lowers to forget positions) and `reordered(rows)` (a cache whose row r is
        row rows[r] of this one)."""
        if not is_integer(batch) or batch < 1:
            raise InputError(f"GPT.new_cache_arrays: batch must be an int >= 1, got {batch!r}")
        c = self.config
        if c.mixer == "ssm":
            return None  # each layer keeps a state of its own (new_caches)
        if c.attention == "latent":
            return None  # each layer caches its latents (gpt/model/electives/latent_attention.py)
        dtype = self.transformer.wte.weight.dtype
        keys = np.zeros((c.n_layer, batch, c.n_kv_head, c.block_size, c.n_embd // c.n_head), dtype=dtype)
        return keys, np.zeros_like(keys)

    def new_caches(self, batch, arrays=None):
        """One empty KVCache per layer, over `arrays` (keys, values), each (n_layer, B, Hk, block_size, D),
        or over new zeroed ones. Latent attention: one empty LatentCache per layer; `mixer` ssm: one SSMCache
        per layer (gpt/model/electives/ssm.py)."""
        if self.config.mixer == "ssm":
            from gpt.model.electives.ssm import new_caches

            return new_caches(self, batch)
        if self.config.attention == "latent":
            from gpt.model.electives.latent_attention import new_latent_caches

            return new_latent_caches(self, batch)
        keys, values = self.new_cache_arrays(batch) if arrays is None else arrays
        return [KVCache(k, v) for k, v in zip(keys, values)]

    def generate_tokens(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_kv_cache=True, seed=None):
        """Yield (next token ids (B,), their logits (B, V)) one step at a time, as `generate` makes
        them. Every argument is checked here, when called, not at the first step."""
        prompt = check_prompt("generate_tokens", idx, self.config.vocab_size)
        check_generation_options("generate_tokens", max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed)
        return sampled_tokens(self, prompt, max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed)

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_kv_cache=True, seed=None):
        """idx (B, T) -> (B, T + max_new_tokens) int tensor: greedy when temperature is 0, else sampled
        from softmax(logits / temperature), optionally limited to the top_k tokens or to the smallest
        set whose probability reaches top_p (gpt/generation/sampling.py, over gpt/generation/decoder.py's Decoder).

        idx: integer ids in [0, vocab_size), B >= 1 sequences of T >= 1 tokens (a Tensor, an array or
        nested lists); max_new_tokens an int >= 0; temperature a finite number >= 0; top_k None or
        an int >= 1 (more than the vocabulary keeps every token); top_p None or a number in (0, 1];
        use_kv_cache True or False; seed None or an int >= 0.
        """
        prompt = check_prompt("generate", idx, self.config.vocab_size)
        check_generation_options("generate", max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed)
        tokens = [t for t, _ in sampled_tokens(self, prompt, max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed, many_steps_per_call=True)]
        new = np.stack(tokens, axis=1) if tokens else np.zeros((prompt.shape[0], 0), dtype=np.int64)
        return mt.tensor(np.concatenate([prompt, new], axis=1))
