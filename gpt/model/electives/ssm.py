"""A selective state-space block (Mamba), the mixer of a block with `mixer` ssm in place of attention
(docs/electives/state-space-models.md).

Attention mixes tokens by letting each read every earlier one: T² work, and a KV cache that grows
with every token. A state-space mixer carries, per channel, a state of d_state numbers from token to
token instead (the selective scan, microtensor/ops/electives/selective_scan.py): T work, and a state
of fixed size. The block, for x (B, T, C), with Di = ssm_expand · C and N = d_state:

    x, z   = in_proj(x) split in two                    (B, T, Di) each: the signal and its gate
    x      = silu(causal_conv(x))                       (B, T, Di): depthwise, d_conv taps
    Δ, B, C = x_proj(x) split into R, N, N               (B, T, R), (B, T, N), (B, T, N)
    Δ      = softplus(dt_proj(Δ))                       (B, T, Di) > 0: each token's step size
    A      = -exp(A_log)                                (Di, N) < 0
    y      = selective_scan(x, Δ, A, B, C, D)           (B, T, Di)
    out    = out_proj(y · silu(z))                      (B, T, C)

Why each part:
- The causal convolution: the scan gives each channel a single decay per step (exp(Δ A), the same
  for every earlier token up to the compounding), so it is good at "how much of the past", poor at
  "the token two places back". A short convolution (d_conv taps, each its own weight) mixes the
  last few tokens directly before the scan; it is built here from slices, products and sums, each
  gradient-checked where it is defined.
- Δ through a low-rank pair (x_proj to R = ceil(C / 16) numbers, then dt_proj to Di) and softplus:
  Δ > 0 always, and its projection costs far less than a full (Di, Di) matrix.
- A = -exp(A_log): A < 0 whatever A_log learns, so that Ā = exp(ΔA) stays in (0, 1) and no state
  grows without bound.
- D: a skip that lets x through the scan unchanged; the gate silu(z) lets the block turn a channel
  off per token, as the gated MLPs do.

Initialization as published (Gu and Dao, 2023): A_log = log(1 .. N) in every channel (the S4D-real
decays), D = 1, dt_proj's bias the inverse softplus of Δ drawn log-uniformly in [0.001, 0.1] and its
weight uniform in ±R^-1/2, the convolution uniform in ±d_conv^-1/2 (PyTorch's default for a
Conv1d of d_conv taps per channel). in_proj and x_proj are drawn like every GPT weight, N(0, 0.02);
out_proj like the other residual projections, N(0, 0.02 / sqrt(2 n_layer)) (Mamba rescales it by
the depth too). One difference: train.py's AdamW decays every matrix (nanoGPT's rule), A_log
and the convolution's weights among them, which pulls A toward -1; Mamba exempts A_log and D.

Generation runs the block as a recurrence (`SSMCache`): per layer the last d_conv - 1 inputs of the
convolution (B, d_conv - 1, Di) and the scan's state (B, Di, N), whatever the length, against
attention's keys and values for every position. A step of several tokens (a prompt) runs them in
one scan. Positions: the scan reads the tokens in order, so the model needs no position encoding
(`pos` none, the default with `mixer` ssm).
"""
import math

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import InputError, nn

DT_MIN, DT_MAX = 0.001, 0.1  # the range of the initial step sizes Δ (log-uniform)
STEPS_KEPT = 16  # a feed of at most this many tokens keeps the state after each, so that a rollback can return to it


def dt_rank(config):
    """R: the width of Δ's low-rank projection, ceil(C / 16) as published."""
    return math.ceil(config.n_embd / 16)


def ssm_parameter_count(config):
    """The numbers one SSM mixer learns (GPT's parameter_count adds n_layer of them)."""
    C, Di, N, K, R = config.n_embd, config.ssm_expand * config.n_embd, config.d_state, config.d_conv, dt_rank(config)
    bias = 1 if config.bias else 0
    in_proj = C * 2 * Di + bias * 2 * Di
    conv = Di * K + Di
    x_proj = Di * (R + 2 * N)
    dt_proj = R * Di + Di
    out_proj = Di * C + bias * C
    return in_proj + conv + x_proj + dt_proj + Di * N + Di + out_proj  # A_log (Di, N) and D (Di,) beside the layers


def ssm_activations_per_token(config):
    """Numbers per token that one SSM mixer's graph keeps for backward (training_step_bytes): in_proj's
    output (2 Di), the convolution's K products and K sums (2 K Di), SiLU's (Di), x_proj's (R + 2N),
    dt_proj's and softplus's steps (about 6 Di), the scan's states (Di N) and output (Di), the gate's
    SiLU and product (2 Di), out_proj's (C)."""
    C, Di, N, K, R = config.n_embd, config.ssm_expand * config.n_embd, config.d_state, config.d_conv, dt_rank(config)
    return 2 * Di + 2 * K * Di + Di + R + 2 * N + 6 * Di + Di * N + Di + 2 * Di + C


def new_caches(model, batch):
    """One empty SSMCache per layer of `model`, for `batch` sequences."""
    mixer = model.transformer.h[0].ssm
    dtype = model.transformer.wte.weight.dtype
    return [SSMCache(batch, mixer.d_inner, mixer.d_state, mixer.d_conv, dtype) for _ in model.transformer.h]


def state_bytes(model, batch=1):
    """Bytes of state generation keeps for `batch` sequences, at any length: per layer the
    convolution's last d_conv - 1 inputs and the scan's state (B, Di, N)."""
    return sum(cache.nbytes() for cache in new_caches(model, batch))


def check_caches(model, caches, batch, offset):
    """The caches a forward continues: one SSMCache per layer, for this batch, having read `offset` tokens."""
    n_layer = model.config.n_layer
    if not isinstance(caches, (list, tuple)) or len(caches) != n_layer or not all(isinstance(c, SSMCache) for c in caches):
        raise InputError(f"GPT: caches must be a list of {n_layer} SSMCaches (from new_caches), got {caches!r:.80}")
    for layer, cache in enumerate(caches):
        if cache.ssm_state.shape[0] != batch:
            raise InputError(f"GPT: the cache of layer {layer} holds {cache.ssm_state.shape[0]} sequences, expected {batch}")
        if cache.length != offset:
            raise InputError(
                f"GPT: offset is {offset}, but the cache of layer {layer} has read {cache.length} tokens; "
                "the new tokens must continue where the cache ends"
            )


def softplus(z):
    """log(1 + e^z), written as relu(z) + log(1 + e^-|z|) so that e^z never overflows."""
    magnitude = F.relu(z) + F.relu(-z)  # |z|
    return F.relu(z) + F.log(1 + F.exp(-magnitude))


class SelectiveSSM(nn.Module):
    """The SSM mixer of one block: (B, T, C) -> (B, T, C). With a cache (SSMCache), the tokens
    continue the sequence the cache holds."""

    # the one-token decode kernel (gpt/generation/decode_kernel.py) computes attention blocks only:
    # a model with this mixer generates through the modules (decode_kernel.can_run asks every module)
    fits_decode_kernel = False

    def __init__(self, config, dtype):
        super().__init__()
        C = config.n_embd
        self.d_inner, self.d_state, self.d_conv, self.dt_rank = config.ssm_expand * C, config.d_state, config.d_conv, dt_rank(config)
        Di, N, K, R = self.d_inner, self.d_state, self.d_conv, self.dt_rank
        self.in_proj = nn.Linear(C, 2 * Di, bias=config.bias, dtype=dtype)
        self.conv_weight = nn.Parameter(np.zeros((K, Di), dtype=dtype))  # tap k reads the token K - 1 - k places back
        self.conv_bias = nn.Parameter(np.zeros(Di, dtype=dtype))
        self.x_proj = nn.Linear(Di, R + 2 * N, bias=False, dtype=dtype)
        self.dt_proj = nn.Linear(R, Di, bias=True, dtype=dtype)
        self.A_log = nn.Parameter(np.zeros((Di, N), dtype=dtype))
        self.D = nn.Parameter(np.ones(Di, dtype=dtype))
        self.out_proj = nn.Linear(Di, C, bias=config.bias, dtype=dtype)
        self.dropout = nn.Dropout(config.dropout)

    def reset_parameters(self, rng, n_layer):
        """The published initialization (the module docstring); GPT._init_weights calls it after its own."""
        Di, N, K, R = self.d_inner, self.d_state, self.d_conv, self.dt_rank
        dtype = self.A_log.dtype
        self.A_log.data[...] = np.log(np.arange(1, N + 1, dtype=np.float64))[None, :].repeat(Di, axis=0).astype(dtype)
        self.D.data[...] = 1
        self.conv_weight.data[...] = rng.uniform(-1 / math.sqrt(K), 1 / math.sqrt(K), (K, Di)).astype(dtype)
        self.conv_bias.data[...] = rng.uniform(-1 / math.sqrt(K), 1 / math.sqrt(K), Di).astype(dtype)
        self.dt_proj.weight.data[...] = rng.uniform(-(R**-0.5), R**-0.5, (R, Di)).astype(dtype)
        dt = np.exp(rng.uniform(math.log(DT_MIN), math.log(DT_MAX), Di))  # (Di,) log-uniform
        self.dt_proj.bias.data[...] = (dt + np.log(-np.expm1(-dt))).astype(dtype)  # softplus⁻¹(dt) = dt + log(1 - e^-dt)
        self.out_proj.weight.data[...] = rng.normal(0.0, 0.02 / math.sqrt(2 * n_layer), self.out_proj.weight.shape).astype(dtype)

    def causal_conv(self, x, history):
        """x (B, T, Di) -> (B, T, Di): output t = bias + sum_k w[k] x[t - (K - 1) + k], reading the
        K - 1 inputs before the first from `history` (B, K - 1, Di) (zeros at a sequence's start)."""
        T, K = x.shape[1], self.d_conv
        padded = F.concat([history, x], dim=1) if K > 1 else x  # (B, K - 1 + T, Di)
        out = self.conv_bias
        for k in range(K):
            out = out + padded[:, k : k + T] * self.conv_weight[k]  # (B, T, Di)
        return out

    def forward(self, x, cache=None, offset=0):
        B, T, _ = x.shape
        Di, N, K, R = self.d_inner, self.d_state, self.d_conv, self.dt_rank
        xz = self.in_proj(x)  # (B, T, 2 Di)
        x, z = xz[..., :Di], xz[..., Di:]
        history = mt.tensor(np.zeros((B, K - 1, Di), dtype=x.dtype)) if cache is None else mt.tensor(cache.conv_state)
        if cache is not None:
            cache.keep_inputs(x.data)
        x = F.silu(self.causal_conv(x, history))  # (B, T, Di)
        dbc = self.x_proj(x)  # (B, T, R + 2 N)
        delta = softplus(self.dt_proj(dbc[..., :R]))  # (B, T, Di)
        B_, C_ = dbc[..., R : R + N], dbc[..., R + N :]  # (B, T, N) each
        A = -F.exp(self.A_log)  # (Di, N)
        if cache is None:
            y = F.selective_scan(x, delta, A, B_, C_, self.D)  # (B, T, Di)
        else:
            y = cache.scan(x, delta, A, B_, C_, self.D)
        return self.dropout(self.out_proj(y * F.silu(z)))


class SSMCache:
    """One layer's state for generation with an SSM mixer: the convolution's last K - 1 inputs
    (B, K - 1, Di) and the scan's state h (B, Di, N): the same size at every length.

    `length` is how many tokens it has read. The Decoder lowers it to forget tokens: to 0 (a new
    window) it starts over from zeros; to a length inside the last feed of at most STEPS_KEPT
    tokens (speculative decoding's rejected drafts) it returns to the state it kept there; any
    other length cannot be recovered from a state of fixed size, and is an error."""

    def __init__(self, batch, d_inner, d_state, d_conv, dtype):
        self.conv_state = np.zeros((batch, d_conv - 1, d_inner), dtype=dtype)  # (B, K - 1, Di)
        self.ssm_state = np.zeros((batch, d_inner, d_state), dtype=dtype)  # (B, Di, N)
        self._length = 0
        self.kept = {0: (self.conv_state.copy(), self.ssm_state.copy())}  # length -> states, for rollback

    @property
    def length(self):
        return self._length

    @length.setter
    def length(self, value):
        if value == self._length:
            return
        if value == 0:
            self.conv_state[...] = 0
            self.ssm_state[...] = 0
        elif value in self.kept:
            conv_state, ssm_state = self.kept[value]
            self.conv_state[...], self.ssm_state[...] = conv_state, ssm_state
        else:
            raise InputError(
                f"SSMCache: cannot go back from {self._length} tokens to {value}: a state-space model keeps one "
                f"state, not one per position; it can return only to 0 or to a length it kept ({sorted(self.kept)})"
            )
        self._length = value
        self.kept = {value: (self.conv_state.copy(), self.ssm_state.copy())}

    def keep_inputs(self, x):
        """Before the convolution reads them: the convolution's inputs (B, T, Di) of the new tokens."""
        self.inputs = np.concatenate([self.conv_state, x], axis=1)  # (B, K - 1 + T, Di)

    def scan(self, x, delta, A, B, C, D):
        """The selective scan of the new tokens from the kept state, which it advances to their end.
        A few tokens are scanned one at a time, keeping the state after each (for a rollback)."""
        T, K = x.shape[1], self.conv_state.shape[1] + 1
        start = self._length
        self.kept = {start: (self.conv_state.copy(), self.ssm_state.copy())}
        if T > STEPS_KEPT:
            y = F.selective_scan(x, delta, A, B, C, D, state=self.ssm_state)
        else:
            pieces = []
            for t in range(T):
                pieces.append(F.selective_scan(x[:, t : t + 1], delta[:, t : t + 1], A, B[:, t : t + 1], C[:, t : t + 1], D, state=self.ssm_state))
                self.kept[start + t + 1] = (self.inputs[:, t + 1 : t + K].copy(), self.ssm_state.copy())
            y = F.concat(pieces, dim=1)
        self.conv_state[...] = self.inputs[:, self.inputs.shape[1] - (K - 1) :]
        self._length = start + T
        return y

    def reordered(self, rows):
        """A cache whose row r is row rows[r] of this one (beam search)."""
        batch, (_, d_inner, d_state) = len(rows), self.ssm_state.shape
        other = SSMCache(batch, d_inner, d_state, self.conv_state.shape[1] + 1, self.ssm_state.dtype)
        other.conv_state[...], other.ssm_state[...] = self.conv_state[rows], self.ssm_state[rows]
        other._length = self._length
        other.kept = {length: (conv[rows], ssm[rows]) for length, (conv, ssm) in self.kept.items()}
        return other

    def nbytes(self):
        return self.conv_state.nbytes + self.ssm_state.nbytes
