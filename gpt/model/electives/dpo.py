"""What DPO needs of a GPT (docs/electives/dpo.md): the log-probability of a continuation given a
prompt, a frozen reference model, and the measures of a fine-tuning (preference accuracy, the
implicit reward margin, the KL from the reference).

    batch = encode_pairs(pairs, tokenizer, config.block_size)          # chosen rows, then rejected
    logp = sequence_log_probs(model, batch.tokens, batch.prompt_lengths, batch.lengths)   # (2B,)
    reference = Reference(frozen_copy(model))      # or Reference(model, adapters_off=True) with LoRA
    ref = reference.log_probs(batch)               # once per batch, under no_grad
    loss = F.dpo_loss(logp[:B], logp[B:], ref[:B], ref[B:], beta)

The sequence log-probability. A row holds the prompt's tokens, then the continuation's, then
padding. The model reads tokens[:, :-1]; position t predicts token t + 1, so with p prompt tokens
and n tokens in all, the continuation's tokens (indices p .. n-1) are predicted at positions
p-1 .. n-2, and

    log π(y|x) = Σ_{t = p-1}^{n-2} log softmax(logits[t])[tokens[t + 1]]

The prompt's own tokens are not counted (the prompt is given, not chosen), nor is padding. The
padding is on the right, so under causal attention it never changes a position that counts: a
position sees only the tokens before it. The sum is a differentiable function of the model's
weights built from public ops (log_softmax, indexing, a mask, a sum), so its backward is the
engine's ordinary one: the same function serves any fine-tuning on a sequence's log-probability
(policy gradients too).

The reference. DPO's loss measures the policy against where it started: the reference is a copy
of the starting checkpoint, frozen (no gradients), run under no_grad once per batch. With LoRA
adapters the base's weights are already frozen, so the reference needs no copy: it is the same
model with the adapters' contribution set to zero (their scale 0 adds exactly nothing).

Dropout is off in both (eval mode): the policy's log-probabilities at step 0 then equal the
reference's exactly, every margin is 0 and the loss starts at log 2.
"""
import copy
import dataclasses
from contextlib import contextmanager

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import InputError

from .lora import lora_layers


@dataclasses.dataclass
class EncodedPairs:
    """A batch of B pairs as 2B rows: rows 0..B-1 the chosen continuations, B..2B-1 the rejected.

    tokens (2B, L) int64, right-padded with id 0; prompt_lengths and lengths (2B,): the prompt's
    tokens and all the row's tokens (prompt and continuation) before the padding."""

    tokens: np.ndarray
    prompt_lengths: np.ndarray
    lengths: np.ndarray

    @property
    def pairs(self):
        return self.tokens.shape[0] // 2


def pack_rows(prompts, continuations, block_size):
    """(tokens, prompt_lengths, lengths) of rows prompt + continuation, right-padded with 0, each at
    most block_size + 1 tokens (the model reads all but the last): a continuation is cut to its
    first block_size tokens, then the prompt to its last tokens that fit (at least one: something
    must predict the continuation's first token)."""
    rows, prompt_lengths = [], []
    for prompt, continuation in zip(prompts, continuations):
        if len(prompt) < 1 or len(continuation) < 1:
            raise InputError(f"pack_rows: a prompt and a continuation of at least one token each, got {len(prompt)} and {len(continuation)}")
        continuation = continuation[:block_size]
        prompt = prompt[-(block_size + 1 - len(continuation)) :]
        rows.append(np.concatenate([prompt, continuation]))
        prompt_lengths.append(len(prompt))
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    tokens = np.zeros((len(rows), int(lengths.max())), dtype=np.int64)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    return tokens, np.array(prompt_lengths, dtype=np.int64), lengths


def encode_pairs(pairs, tokenizer, block_size):
    """EncodedPairs of PreferencePairs (gpt/text/electives/preferences.py), for a model of this block size."""
    prompts = [tokenizer.encode(pair.prompt) for pair in pairs]
    chosen = [tokenizer.encode(pair.chosen) for pair in pairs]
    rejected = [tokenizer.encode(pair.rejected) for pair in pairs]
    return EncodedPairs(*pack_rows(prompts + prompts, chosen + rejected, block_size))


def continuation_mask(prompt_lengths, lengths, width):
    """(N, width) float mask of the positions whose prediction is a continuation's token: position t
    of row i counts when prompt_lengths[i] - 1 <= t < lengths[i] - 1."""
    positions = np.arange(width)[None, :]  # (1, width)
    return ((positions >= prompt_lengths[:, None] - 1) & (positions < lengths[:, None] - 1)).astype(np.float64)


def sequence_log_probs(model, tokens, prompt_lengths, lengths, temperature=1.0):
    """log π(continuation | prompt) of each row, a (N,) tensor: the sum of the log-probabilities of
    the continuation's tokens (the module docstring). tokens (N, L) int, right-padded; prompt_lengths
    and lengths (N,): the prompt's tokens and the row's before padding, 1 <= prompt < length <= L.
    temperature: the distribution softmax(logits / temperature), the one sampling at that
    temperature draws from (policy gradients need the log-probabilities of what they sampled)."""
    tokens = np.asarray(tokens)
    prompt_lengths, lengths = np.asarray(prompt_lengths), np.asarray(lengths)
    N, L = tokens.shape
    if prompt_lengths.shape != (N,) or lengths.shape != (N,) or np.any(prompt_lengths < 1) or np.any(lengths <= prompt_lengths) or np.any(lengths > L):
        raise InputError(
            f"sequence_log_probs: expected prompt_lengths and lengths of shape ({N},) with 1 <= prompt < length <= {L}, "
            f"got {prompt_lengths.tolist()} and {lengths.tolist()}"
        )
    logits, _ = model(tokens[:, :-1])  # (N, L-1, V)
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = F.log_softmax(logits, dim=-1)  # (N, L-1, V)
    rows, positions = np.arange(N)[:, None], np.arange(L - 1)[None, :]
    picked = log_probs[rows, positions, tokens[:, 1:]]  # (N, L-1): log p(tokens[t+1] | tokens[:t+1])
    mask = mt.tensor(continuation_mask(prompt_lengths, lengths, L - 1).astype(picked.dtype))
    return (picked * mask).sum(dim=1)  # (N,)


def frozen_copy(model):
    """A copy of model whose parameters need no gradient: the reference."""
    reference = copy.deepcopy(model)
    for param in reference.parameters():
        param.requires_grad_(False)
    reference.eval()
    return reference


@contextmanager
def adapters_off(model):
    """Inside the block, every LoRA adapter of model adds nothing (its scale is 0): the frozen base."""
    layers = [layer for _, layer in lora_layers(model)]
    scales = [layer.scale for layer in layers]
    try:
        for layer in layers:
            layer.scale = 0.0
        yield model
    finally:
        for layer, scale in zip(layers, scales):
            layer.scale = scale


class Reference:
    """The frozen reference π_ref: a separate model, or (adapters_off=True) the policy's own base
    with its LoRA adapters switched off."""

    def __init__(self, model, adapters_off=False):
        self.model, self.adapters_off = model, adapters_off

    @contextmanager
    def running(self):
        """The reference model, in eval mode, without gradients, for the block."""
        with mt.no_grad(), (adapters_off(self.model) if self.adapters_off else _nothing()):
            was_training = self.model.training
            self.model.eval()
            try:
                yield self.model
            finally:
                self.model.train(was_training)

    def log_probs(self, batch):
        """(2B,) numpy array: the reference's sequence log-probabilities of an EncodedPairs."""
        with self.running() as model:
            return sequence_log_probs(model, batch.tokens, batch.prompt_lengths, batch.lengths).numpy()


@contextmanager
def _nothing():
    yield


def dpo_batch_loss(policy, reference, batch, beta):
    """(loss tensor, margins (B,), gaps (B,)) of DPO on one EncodedPairs: the policy's log-probabilities
    with their graph, the reference's computed once, without one. margins: m, the log-ratio margin;
    gaps: log π(y⁺|x) - log π(y⁻|x), the policy's own preference (numpy arrays)."""
    B = batch.pairs
    policy_logp = sequence_log_probs(policy, batch.tokens, batch.prompt_lengths, batch.lengths)  # (2B,)
    reference_logp = mt.tensor(reference.log_probs(batch).astype(policy_logp.dtype))  # (2B,), a constant
    loss = F.dpo_loss(policy_logp[:B], policy_logp[B:], reference_logp[:B], reference_logp[B:], beta)
    logp = policy_logp.numpy()
    ratios = logp - reference_logp.numpy()  # log π - log π_ref of each row
    return loss, ratios[:B] - ratios[B:], logp[:B] - logp[B:]


@mt.no_grad()
def evaluate(policy, reference, batches, beta):
    """The measures of a fine-tuning on held-out EncodedPairs batches: a dict of

        accuracy          the fraction of pairs whose implicit reward margin is > 0 (0 at the
                          start, where every margin is 0)
        likelihood_accuracy  the fraction of pairs with log π(y⁺|x) > log π(y⁻|x): the policy's own
                          preference, which the reference has too
        reward_margin     the mean implicit reward margin β m (β times the log-ratio margin)
        loss              the mean DPO loss
        kl                the mean per-token KL(π ‖ π_ref) at the positions of the chosen
                          continuations, exact over the vocabulary: Σ_v π(v) (log π(v) - log π_ref(v))
    """
    was_training = policy.training
    policy.eval()
    margins, gaps, losses, kl_sum, kl_count = [], [], [], 0.0, 0.0
    for batch in batches:
        B = batch.pairs
        loss, margin, gap = dpo_batch_loss(policy, reference, batch, beta)
        margins.append(margin)
        gaps.append(gap)
        losses.append(loss.item() * B)
        chosen = batch.tokens[:B, :-1]
        mask = continuation_mask(batch.prompt_lengths[:B], batch.lengths[:B], chosen.shape[1])  # (B, L-1)
        policy_log = F.log_softmax(policy(chosen)[0], dim=-1).numpy().astype(np.float64)  # (B, L-1, V)
        with reference.running() as model:
            reference_log = F.log_softmax(model(chosen)[0], dim=-1).numpy().astype(np.float64)
        kl = (np.exp(policy_log) * (policy_log - reference_log)).sum(axis=-1)  # (B, L-1)
        kl_sum += float((kl * mask).sum())
        kl_count += float(mask.sum())
    policy.train(was_training)
    margins = np.concatenate(margins)
    return {
        "accuracy": float(np.mean(margins > 0)),
        "likelihood_accuracy": float(np.mean(np.concatenate(gaps) > 0)),
        "reward_margin": float(beta * margins.mean()),
        "loss": float(sum(losses) / len(margins)),
        "kl": kl_sum / kl_count,
        "pairs": len(margins),
    }


def batched(encoded_pairs_fn, pairs, batch_size):
    """EncodedPairs of pairs in consecutive batches of batch_size (the last may be shorter)."""
    return [encoded_pairs_fn(pairs[i : i + batch_size]) for i in range(0, len(pairs), batch_size)]
