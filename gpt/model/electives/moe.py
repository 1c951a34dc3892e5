"""A mixture-of-experts MLP for the GPT's MLP slot: E small MLPs (the experts), and a router that
sends each token to k of them.

    x (B, T, C) -> rows (N, C), N = B T
    p       = softmax(rows @ W_r)                   (N, E)   the router's probabilities
    experts = each row's k most probable experts    (N, k)   a selection made with numpy: no gradient
    gates   = those k probabilities / their sum     (N, k)   each row sums to 1; differentiable through p
              (with k = 1: the probability itself, Switch Transformer's gate; see below)
    out[n]  = sum_j gates[n, j] Expert_{experts[n, j]}(rows[n])             (N, C) -> (B, T, C)

Why renormalize: the output is then a weighted mean of the chosen experts' answers, of the same
size whatever k and however the probability is spread over the experts not chosen. With top_k = 1
renormalizing would make the one gate p / p = 1 whatever p is, and the output's loss would give the
router no gradient at all; so with k = 1 the gate is the probability p itself, as in Switch
Transformer (with k >= 2 the renormalized gates still move with p).

Each expert runs on ITS tokens only: gather their rows, run the expert on those M_e rows, scale
each answer by its gate, and scatter-add it back into its token's row (ops/electives/moe.py holds these
ops and derives their backward). A token thus costs k experts' work, not E: the parameters grow E
times, the arithmetic per token only k times.

The load-balancing loss (Switch Transformer, Fedus et al. 2021). Left alone, a router tends to
collapse onto a few experts: the experts it favours early get more tokens, train faster, and get
favoured more. After every forward, `aux_loss` holds

    aux_loss = E · sum_e f_e · P_e

    f_e = (slots routed to e) / (N k)        the fraction of the N k routing slots e received: a constant
    P_e = (1/N) sum_n p[n, e]                 the mean router probability of e: differentiable

It is 1 when the routing is uniform (f_e = P_e = 1/E) and grows as tokens pile onto few experts
(up to E, when every token goes to one expert with probability 1). f comes from the discrete
choice, which has no gradient, so it is a constant; P carries the gradient, and
dL/dp[n, e] = E f_e / N lowers the probability of the experts that received most tokens. The
training loss adds it times a small coefficient (`total_aux_loss` below sums it over the layers).

`tokens_per_expert`, an int array (E,), counts the slots each expert received in the last forward
(it sums to N k), for utilization reports (`expert_utilization`).

Generation. Under `mt.no_grad` the layer computes the same thing without recording a graph. The
KV cache does not concern it: an MLP looks at each token alone, so a token is routed the same way
whether it arrives with its whole prompt or one step at a time from a cache; nothing is cached.
"""
import math

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import InputError, InputTypeError, nn
from microtensor.functional import gather_rows, scatter_add_rows, top_k_experts, top_k_gates

KINDS = ("gelu", "swiglu")


class Expert(nn.Module):
    """One expert: the GPT's MLP without its dropout, (M, C) -> (M, C). GELU: c_proj(gelu(c_fc(x)));
    SwiGLU: c_proj(swiglu(c_fc(x), c_up(x))). Same parameter names as gpt/model/transformer.py's MLP."""

    def __init__(self, n_embd, hidden, bias, dtype, kind):
        super().__init__()
        self.kind = kind
        self.c_fc = nn.Linear(n_embd, hidden, bias=bias, dtype=dtype)
        if kind == "swiglu":
            self.c_up = nn.Linear(n_embd, hidden, bias=bias, dtype=dtype)
        self.c_proj = nn.Linear(hidden, n_embd, bias=bias, dtype=dtype)

    def forward(self, x):
        if self.kind == "swiglu":
            h = F.swiglu(self.c_fc(x), self.c_up(x))
        else:
            h = F.gelu(self.c_fc(x), approximate="tanh")
        return self.c_proj(h)


def _check_size(name, flag, value):
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"MixtureOfExperts: {name} ({flag}) must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise InputError(f"MixtureOfExperts: {name} ({flag}) must be >= 1, got {value}")
    return int(value)


class MixtureOfExperts(nn.Module):
    """n_expert MLPs of width `hidden` (Expert), each token sent to its top_k by a router
    (`router.weight` (C, E), no bias). kind: "gelu" or "swiglu", as the GPT's MLP. dropout: applied
    to the output in training mode, as the GPT's MLP does. See the module docstring."""

    def __init__(self, n_embd, n_expert, top_k, hidden, bias=False, dtype=mt.float32, kind="gelu", dropout=0.0):
        super().__init__()
        n_embd = _check_size("n_embd", "--n-embd", n_embd)
        hidden = _check_size("hidden", "the MLP's width", hidden)
        n_expert = _check_size("n_expert", "--n-expert", n_expert)
        if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, (bool, np.bool_)):
            raise InputTypeError(f"MixtureOfExperts: top_k (expert_top_k, --expert-top-k) must be an int, got {type(top_k).__name__} {top_k!r}")
        if not 1 <= top_k <= n_expert:
            raise InputError(
                f"MixtureOfExperts: top_k (expert_top_k, --expert-top-k) must be in [1, n_expert] = [1, {n_expert}] "
                f"(each token goes to top_k different experts of the n_expert (--n-expert)), got {top_k}"
            )
        if not isinstance(kind, str) or kind not in KINDS:
            raise InputError(f"MixtureOfExperts: kind must be one of {KINDS}, got {kind!r}")
        if not isinstance(bias, (bool, np.bool_)):
            raise InputTypeError(f"MixtureOfExperts: bias must be True or False, got {type(bias).__name__} {bias!r}")
        self.n_embd, self.n_expert, self.top_k, self.hidden, self.kind = n_embd, n_expert, int(top_k), hidden, kind
        self.router = nn.Linear(n_embd, n_expert, bias=False, dtype=dtype)
        self.experts = nn.ModuleList([Expert(n_embd, hidden, bool(bias), dtype, kind) for _ in range(n_expert)])
        self.dropout = nn.Dropout(dropout)
        self.aux_loss = None  # after a forward: E · sum_e f_e P_e, a scalar Tensor
        self.tokens_per_expert = np.zeros(n_expert, dtype=np.int64)  # after a forward: slots per expert (E,)

    def forward(self, x):
        """x (..., C), usually (B, T, C) -> (..., C). Sets self.aux_loss and self.tokens_per_expert."""
        dtype = self.router.weight.dtype
        if not isinstance(x, mt.Tensor):
            raise InputTypeError(f"MixtureOfExperts: expected a Tensor input, got {type(x).__name__}; wrap it with mt.tensor(...)")
        if x.ndim == 0 or x.shape[-1] != self.n_embd:
            raise InputError(f"MixtureOfExperts: expected an input whose last dim is n_embd = {self.n_embd}, got shape {x.shape}")
        if x.dtype != dtype:
            raise InputTypeError(f"MixtureOfExperts: expected a {dtype} input (the layer's dtype), got {x.dtype}; cast one with .to()")
        N, C, E, k = math.prod(x.shape[:-1]), self.n_embd, self.n_expert, self.top_k
        if N == 0:
            raise InputError(f"MixtureOfExperts: the input of shape {x.shape} has no tokens to route")

        rows = x.reshape(N, C)  # (N, C): one row per token
        probs = F.softmax(self.router(rows), dim=-1)  # (N, E)
        chosen = top_k_experts(probs.data, k)  # (N, k) int64, made by numpy from the values: no gradient
        if k > 1:
            gates = top_k_gates(probs, chosen)  # (N, k), each row sums to 1
        else:  # Switch's gate: the chosen expert's probability, picked out by a one-hot mask
            one_hot = np.zeros((N, E), dtype=dtype)
            one_hot[np.arange(N), chosen[:, 0]] = 1
            gates = (probs * mt.tensor(one_hot)).sum(dim=-1, keepdim=True)  # (N, 1)
        slot_gates = gates.reshape(N * k, 1)  # slot s = n k + j holds token n's j-th gate
        slot_experts = chosen.reshape(N * k)  # (N k,) the expert of each slot

        out = None
        for e, expert in enumerate(self.experts):
            slots = np.flatnonzero(slot_experts == e)  # (M_e,) this expert's slots, in token order
            if slots.size == 0:
                continue  # no token chose it: it does no work and gets no gradient this step
            tokens = slots // k  # (M_e,) the token of each slot
            answers = expert(gather_rows(rows, tokens))  # (M_e, C)
            weights = gather_rows(slot_gates, slots).reshape(slots.size)  # (M_e,) their gates
            contribution = scatter_add_rows(answers, tokens, N, weights)  # (N, C), zero for other tokens
            out = contribution if out is None else out + contribution

        counts = np.bincount(slot_experts, minlength=E)  # (E,) slots per expert, summing to N k
        fraction = mt.tensor((counts / (N * k)).astype(dtype))  # f (E,): a constant
        mean_probs = F.mean(probs, dim=0)  # P (E,): carries the gradient to the router
        self.aux_loss = (fraction * mean_probs).sum() * E
        self.tokens_per_expert = counts
        return self.dropout(out.reshape(x.shape))

    def extra_repr(self):
        return f"n_expert={self.n_expert}, top_k={self.top_k}, hidden={self.hidden}, kind={self.kind!r}"


def moe_layers(model):
    """(dotted name, MixtureOfExperts) for every mixture-of-experts layer in `model`, in order."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, MixtureOfExperts)]


def total_aux_loss(model):
    """The sum of every MoE layer's aux_loss from the model's last forward (a scalar Tensor, in the
    graph of that forward), or None when the model has no MoE layer. Call it after the forward and
    before backward; the training loss is then loss + coefficient * total_aux_loss(model)."""
    losses = [module.aux_loss for _, module in moe_layers(model)]
    if not losses:
        return None
    if any(loss is None for loss in losses):
        raise InputError("total_aux_loss: a mixture-of-experts layer has not run a forward yet")
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    return total


def expert_utilization(model):
    """{layer name: the fraction of routing slots each expert received in the last forward, (E,)
    floats summing to 1}; a uniform router gives 1/E everywhere."""
    return {name: module.tokens_per_expert / max(1, int(module.tokens_per_expert.sum())) for name, module in moe_layers(model)}
