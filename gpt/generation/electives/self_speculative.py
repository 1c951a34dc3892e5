"""Self-speculative decoding (docs/electives/multi-token-prediction.md): a model trained with
`mtp` n drafts its own next tokens with its extra heads, and checks them with its next-token head.

One forward of the trunk over position t gives the hidden state h_t. From it the next-token head
gives p(x_{t+1}) and the extra heads give q_k(x_{t+k}), k = 2 .. n: a draft of n - 1 tokens past
the next one, for the price of n - 1 small MLPs, with no second model and no second cache.

A round, with the sequence x_1 .. x_m whose last token x_m is not yet in the cache, and drafts
d_{m+1} .. d_{m+n-1} drawn from the heads at h_{m-1}:

    feed x_m, d_{m+1}, .., d_{m+n-1}  (n tokens, one forward over the KV cache)
      -> p at each of them: p_1 .. p_n, the next-token head's distributions after each prefix,
         and the hidden states h_m .. h_{m+n-1}
    accept or resample (gpt/generation/electives/speculative.py's rule, `accept_or_resample`):
         j drafts accepted, then one token from the residual, or from p_n when all are accepted
    the cache forgets the positions past x_m, d_{m+1} .. d_{m+j}; the next drafts come from the
         extra heads at the last of them, h_{m+j}

So a round costs one trunk forward over n tokens and gives 1 to n tokens. The rule keeps the next-
token head's distribution exactly, whatever the drafts are (docs/electives/speculative-decoding.md);
a draft of head k read from h_{m+j} does not know the token the round ends with (it guesses past
it), which only lowers its chance of being accepted. At temperature 0 every distribution is one-hot,
a draft is accepted exactly when it is the next-token head's argmax, and the output is greedy
decoding's, token for token.

The window rule is the Decoder's (gpt/generation/decoder.py): a round drafts few enough tokens that
the window does not move inside it, so every position is scored over the window plain generation
gives it.

Under the fast kernel set, a round's forward is one call of the decode kernel
(gpt/generation/decode_kernel.py), which returns the last layer's output beside the logits, and the
extra heads run on it in a kernel of their own (`draft_logits`). At temperature 0 there is nothing
to draw, so the rounds themselves run inside one kernel call (`decode_self_speculative`), for as
many tokens as the window holds without moving: no Python between the rounds, which is what lets
the drafts pay against the kernel's plain greedy loop. Otherwise (the readable set, a model the
kernel does not cover, a prompt of many tokens) the trunk goes through the modules with the KV cache.
"""

import numpy as np

import microtensor as mt
from microtensor import InputError, InputTypeError

from gpt.generation.decoder import KERNEL_TOKENS, SINGLE_THREAD_TOKENS, Decoder, check_generation_options, check_one_sequence
from gpt.generation.electives.speculative import SpeculativeStats, accept_or_resample, draw
from gpt.generation.sampling import token_distribution
from gpt.model.electives.mtp import head_logits
from gpt.model.transformer import GPT


class HiddenStateDecoder(Decoder):
    """The Decoder, whose `feed_hidden` also returns the trunk's output: the extra heads read it."""

    def __init__(self, model, batch, prompt_length, use_kv_cache=True):
        super().__init__(model, batch, prompt_length, use_kv_cache)
        # the extra heads in the decode kernel's form, when the kernel runs this model
        self.kernel_heads = None if self.kernel is None else self.kernel.draft_heads(model)

    def feed_hidden(self, sequences):
        """sequences (1, n): every token so far. As Decoder.feed, with the KV cache: returns
        (logits (1, m, V), hidden (1, m, C)) of the m positions not yet in the cache, arrays."""
        n = sequences.shape[1]
        self.advance(n)
        new_tokens = sequences[:, self.start :][:, self.fed :]  # (1, m)
        if self.kernel is not None and new_tokens.shape[1] <= KERNEL_TOKENS:
            logits, hidden = self.kernel.decode(self.kernel_weights, new_tokens, self.fed, self.keys, self.values, hidden=True)
        else:
            self.hold(self.fed)  # a moved window or a rollback starts writing here
            # a few tokens are too little work to share: waking a thread costs more (mt.num_threads)
            with mt.num_threads(1 if new_tokens.size <= SINGLE_THREAD_TOKENS else None):
                hidden = self.model.trunk(mt.tensor(new_tokens), self.caches, self.fed)  # (1, m, C)
                logits = self.model.logits_of(hidden).data  # (1, m, V)
            hidden = hidden.data
        self.hold(self.fed + new_tokens.shape[1])
        return logits, hidden

    def head_logits(self, hidden):
        """The extra heads' logits (mtp - 1, V) from one position's trunk output, hidden (C,)."""
        if self.kernel_heads is not None:
            return self.kernel.decode_drafts(self.kernel_weights, self.kernel_heads, hidden)
        with mt.num_threads(1):  # one position: too little work to share
            row = mt.tensor(hidden[None, None])  # (1, 1, C)
            return np.concatenate([head_logits(self.model, row, k).data[0] for k in range(2, self.model.config.mtp + 1)])


class SelfSpeculativeDecoder:
    """The state of one self-speculative generation: the sequence, the cache, the pending drafts
    and their distributions. Each `round` runs the trunk once (see the module docstring)."""

    def __init__(self, model, prompt, temperature, top_k=None, top_p=None, seed=None):
        self.model = model
        self.sequence = prompt  # (1, m): the prompt and every token produced
        self.options = (temperature, top_k, top_p)
        self.rng = np.random.default_rng(seed)
        self.cache = HiddenStateDecoder(model, 1, prompt.shape[1], use_kv_cache=True)
        self.drafts, self.q = [], np.zeros((0, model.config.vocab_size))  # from the heads at the last fed position
        self.stats = SpeculativeStats()

    def drafts_allowed(self, limit):
        """How many drafts this round may check: those the heads gave, fewer than `limit` (the tokens
        still wanted), and few enough that the window does not move up to the round's last length."""
        m = self.sequence.shape[1]
        room = self.cache.block - (m - self.cache.start_for(m))
        return max(0, min(len(self.drafts), limit - 1, room))

    def round(self, limit):
        """Verify the drafts, accept or resample, draft again; returns the new tokens (1 to min(n, limit))."""
        m = self.sequence.shape[1]
        self.cache.advance(m)  # the window rule at length m; drafts_allowed keeps it from moving again
        k = self.drafts_allowed(limit)
        proposed, q = self.drafts[:k], self.q[:k]
        sequence = np.concatenate([self.sequence, np.array([proposed], dtype=np.int64).reshape(1, k)], axis=1)
        logits, hidden = self.cache.feed_hidden(sequence)  # rows of positions m - 1 .. m + k - 1 last
        p = token_distribution(logits[0, -(k + 1) :], *self.options)  # (k + 1, V): p_1 .. p_{k+1}
        accepted, token = accept_or_resample(p, q, proposed, self.rng)
        new = (proposed[:accepted] + [token])[:limit]
        # the cache keeps x_m and the accepted drafts; the token the round ends with is fed next round
        keep = m + accepted
        self.cache.rollback(keep)
        self.draft_from(hidden[0, hidden.shape[1] - (k + 1) + accepted])  # h at position keep - 1
        self.sequence = np.concatenate([self.sequence, np.array([new], dtype=np.int64)], axis=1)
        self.stats.rounds += 1
        self.stats.proposed += k
        self.stats.accepted += accepted
        self.stats.generated += len(new)
        return new

    def greedy_rounds(self, limit):
        """At temperature 0 under the decode kernel: rounds in one kernel call, for as many tokens
        (at most `limit`) as the window holds without moving; returns them, or None when the kernel
        cannot take this step (then `round` does)."""
        cache = self.cache
        m = self.sequence.shape[1]
        cache.advance(m)
        new_tokens = self.sequence[:, cache.start + cache.fed :]  # (1, n): the last is not in the cache yet
        if cache.kernel_heads is None or new_tokens.shape[1] > KERNEL_TOKENS:
            return None
        steps = min(limit, cache.block - (m - cache.start) + 1)  # the last token fed stays inside the window
        chosen, drafts, (rounds, proposed, accepted) = cache.kernel.decode_self_speculative(
            cache.kernel_weights, cache.kernel_heads, new_tokens, cache.fed, steps, cache.keys, cache.values, self.drafts
        )
        cache.hold(cache.fed + new_tokens.shape[1] + steps - 1)
        self.drafts = [int(d) for d in drafts]
        self.q = np.zeros((len(self.drafts), self.model.config.vocab_size))
        self.q[np.arange(len(self.drafts)), drafts] = 1  # temperature 0: each draft's distribution is one-hot
        self.sequence = np.concatenate([self.sequence, chosen[None]], axis=1)
        self.stats.rounds += rounds
        self.stats.proposed += proposed
        self.stats.accepted += accepted
        self.stats.generated += steps
        return list(chosen)

    def draft_from(self, hidden):
        """The extra heads' drafts from one hidden state (C,): head k proposes the token k places
        past it, so head 2 the one after the token this round ends with."""
        q = token_distribution(self.cache.head_logits(hidden), *self.options)  # (mtp - 1, V)
        self.drafts = [draw(row, self.rng) for row in q]
        self.q = q


def _check(where, model, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed):
    if not isinstance(model, GPT):
        raise InputTypeError(f"{where}: the model must be a GPT, got {type(model).__name__}")
    if model.config.mtp < 2:
        raise InputError(
            f"{where}: the model has no extra heads to draft with (mtp is {model.config.mtp}); "
            "train it with --mtp 2 or more (docs/electives/multi-token-prediction.md)"
        )
    check_generation_options(where, max_new_tokens, temperature, top_k, top_p, True, seed)
    return check_one_sequence(where, prompt_ids, model.config.vocab_size)


def self_speculative_tokens(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None, stats=None):
    """Yield the new token ids one at a time (as ints); `stats`, a SpeculativeStats (a round is one trunk forward; the drafts are the extra heads'), is updated
    as the rounds run. Arguments as `self_speculative_generate`."""
    prompt = _check("self_speculative_tokens", model, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed)
    return _tokens(model, prompt, max_new_tokens, temperature, top_k, top_p, seed, stats)


def _tokens(model, prompt, max_new_tokens, temperature, top_k, top_p, seed, stats):
    decoder = SelfSpeculativeDecoder(model, prompt, temperature, top_k, top_p, seed)
    if stats is not None:
        decoder.stats = stats
    with decoder.cache:  # evaluation mode, without gradients
        produced = 0
        while produced < max_new_tokens:
            new = decoder.greedy_rounds(max_new_tokens - produced) if temperature == 0 else None
            for token in decoder.round(max_new_tokens - produced) if new is None else new:
                produced += 1
                yield int(token)


def self_speculative_generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None):
    """max_new_tokens tokens after prompt_ids, distributed as the model's own sampling (greedy at
    temperature 0: its greedy tokens), drafted by its extra heads. Returns (new tokens
    (max_new_tokens,) int64, SpeculativeStats).

    model: a GPT with mtp >= 2; prompt_ids: (T,) or (1, T) token ids; temperature, top_k, top_p,
    seed as GPT.generate (the drafts' distributions q_k take the same temperature, top_k and top_p).
    """
    prompt = _check("self_speculative_generate", model, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed)
    stats = SpeculativeStats()
    tokens = list(_tokens(model, prompt, max_new_tokens, temperature, top_k, top_p, seed, stats))
    return np.array(tokens, dtype=np.int64), stats
