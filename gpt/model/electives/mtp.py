"""Multi-token prediction (docs/electives/multi-token-prediction.md): n - 1 extra heads on the
trunk's output, head k predicting the token k places ahead.

The trunk (the embeddings and the n_layer blocks) turns the tokens x_1 .. x_T into hidden states
h_1 .. h_T (B, T, C); h_t has seen x_{<=t} only. The next-token head is the model's own:
logits_1 = unembed(ln_f(h)). Extra head k = 2 .. n is

    logits_k = unembed(ln_f(h + mlp_k(ln_k(h))))          (B, T, V)

a residual MLP of its own (ln_k, c_fc, c_proj: the block's MLP half) and then the final norm and
the unembedding that every head shares. The loss is

    L = sum_k w_k · CE_k,     CE_k = mean over the positions t <= T - k + 1 of -log p_k(x_{t+k} | x_{<=t})

with w = (1, ..., 1) unless `mtp_weights` gives them. With targets y (B, T), y_t = x_{t+1}, the
target of head k at position t is y_{t+k-1}: positions t > T - k + 1 have no target inside the
sequence, so head k is computed on the first T - k + 1 positions only; they are left out, not
padded with a made-up target. A sequence shorter than k leaves head k without any position, and
its term out of the sum.

Why a position-wise head (no attention): the trunk's attention has already mixed the context into
h_t, and the head only has to read a different future from it. Without attention a head needs no
KV cache, so self-speculative decoding (gpt/generation/electives/self_speculative.py) runs the
extra heads on one hidden state, for the price of n - 1 small MLPs. Gloeckle et al. (2024) give
each head a whole transformer layer, DeepSeek-V3 chains full blocks that also read the next token's
embedding; both learn more, and both need a cache per head to draft from.

No new op: the heads are Linear, LayerNorm, GELU, slicing and cross-entropy, each gradient-checked
where it is defined.
"""
import microtensor.functional as F
from microtensor import InputError, nn


def parse_weights(text, n):
    """The weights (w_1, ..., w_n) of `mtp_weights`: None gives n ones; else n finite numbers >= 0,
    comma-separated, not all zero. Raises InputError saying what is wrong (GPTConfig names the field)."""
    if text is None:
        return [1.0] * n
    try:
        weights = [float(part) for part in str(text).split(",")]
    except ValueError:
        raise InputError(f"mtp_weights must be numbers separated by commas, got {text!r}") from None
    if len(weights) != n:
        raise InputError(f"mtp_weights gives {len(weights)} weights, but mtp is {n}: one weight per head")
    if not all(w >= 0 and w != float("inf") for w in weights) or not any(w > 0 for w in weights):
        raise InputError(f"mtp_weights must be finite numbers >= 0, not all zero, got {text!r}")
    return weights


class MTPHead(nn.Module):
    """One extra head's own layers: h + mlp(ln_1(h)), (B, T, C) -> (B, T, C). ln_f and the
    unembedding after it are the model's, shared with the next-token head."""

    def __init__(self, config, dtype):
        super().__init__()
        from gpt.model.transformer import MLP, _norm  # imported here: transformer.py imports this module's users

        self.ln_1 = _norm(config, dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, h):
        return h + self.mlp(self.ln_1(h))


def extra_heads(config, dtype):
    """The n - 1 extra heads of `mtp` n: head k = 2 .. n is entry k - 2."""
    return nn.ModuleList([MTPHead(config, dtype) for _ in range(config.mtp - 1)])


def head_logits(model, hidden, k):
    """Head k's logits (B, T, V) from the trunk's hidden states (B, T, C); k = 1 is the next-token head."""
    if k > 1:
        hidden = model.mtp_heads[k - 2](hidden)
    return model.logits_of(hidden)


def multi_token_loss(model, hidden, next_token_loss, targets):
    """(L, [CE_1, ..., CE_n]): the weighted sum and each head's loss (scalar Tensors; a head without
    any position that has a target is None). hidden (B, T, C): the trunk's output; targets (B, T):
    the next tokens; next_token_loss: CE_1, already computed from the model's logits."""
    weights = parse_weights(model.config.mtp_weights, model.config.mtp)
    T = hidden.shape[1]
    losses = [next_token_loss]
    for k in range(2, model.config.mtp + 1):
        if T - k + 1 < 1:
            losses.append(None)  # no position of this sequence has a token k places ahead
            continue
        logits = head_logits(model, hidden[:, : T - k + 1], k)  # (B, T - k + 1, V)
        losses.append(F.cross_entropy(logits, targets[:, k - 1 :]))  # y_{t+k-1} = x_{t+k}
    total = None
    for weight, loss in zip(weights, losses):
        if loss is not None and weight != 0:
            term = loss if weight == 1 else loss * weight
            total = term if total is None else total + term
    if total is None:  # only zero-weighted heads have targets: the loss is 0, still a graph
        total = next_token_loss * 0.0
    return total, losses


def next_token_loss(model, loss):
    """The next-token head's loss of the last forward (a scalar Tensor): what evaluation reports,
    whatever the extra heads add to the training loss."""
    if getattr(model.config, "mtp", 1) > 1 and model.head_losses is not None:
        return model.head_losses[0]
    return loss


def head_loss_values(model):
    """The floats [CE_1, ..., CE_n] of the last forward (nan for a head without targets)."""
    return [float("nan") if loss is None else loss.item() for loss in model.head_losses]

