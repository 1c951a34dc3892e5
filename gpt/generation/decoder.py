"""The Decoder: a GPT's logits for growing sequences, one new token (or a prompt) at a time.

Every way of generating (sampling in gpt/generation/sampling.py, beam search in gpt/generation/electives/beam_search.py,
speculative decoding in gpt/generation/electives/speculative.py) is an algorithm over a Decoder: it hands the
Decoder the sequences so far, gets the logits of their new positions, chooses tokens, and repeats.
The Decoder owns everything those algorithms share:

- evaluation mode and no gradients, while it is open (`with Decoder(...) as decoder:`);
- the context window: which tokens the model sees (`window_start`, below);
- the KV cache: every layer keeps its keys and values in arrays (B, Hk, block_size, D) with a write
  position (Hk = n_kv_head), so that a new token costs one token's work; the cache is rebuilt when
  the window moves, forgets positions (`rollback`) and follows reordered sequences (`reorder`);
- the step, chosen once when it is made: without a cache the whole window goes through the model
  every time; with one, the new tokens go through the modules, or, under the fast kernel set
  (`mt.set_kernels("fast")`, the default) for one token per sequence, through one kernel call for
  the whole model (gpt/generation/decode_kernel.py), which gives the same logits and writes the same cache.

The context window rule (`window_start`), shared by the cached and uncached steps so that both
compute the same logits: the model sees the tokens from `start` on; once they would exceed
block_size, `start` jumps forward so that the last max(1, block_size // 2) tokens remain, and the
cache is rebuilt from those (positions restart at 0 in the new window). A prompt longer than the
block starts with its last block_size tokens. Where the window starts depends only on the
sequences' length, never on their tokens, so every row of a batch has its window at one place.

Every argument of generation is checked before any kernel runs (the `check_*` functions below):
the kernels index without bounds checks, so an id outside the vocabulary would otherwise read
outside the embedding table.
"""
import math
import subprocess

import numba
import numpy as np

import microtensor as mt
from microtensor import InputError, InputTypeError, nn
from microtensor.checks import is_integer, is_real_number

SINGLE_THREAD_TOKENS = 16  # steps over at most this many tokens run the kernels on one thread
# At most this many new tokens per sequence go through the fast set's decode kernel (its products
# share each weight read among them); more (a long prompt, a rebuilt window) go through the modules,
# whose products use every thread.
KERNEL_TOKENS = 16


def window_start(length, start, block_size):
    """The context window rule: where the window of a sequence of `length` tokens starts, given that
    it started at `start` so far. It stays while the window holds at most block_size tokens; past
    that it jumps forward so that the last max(1, block_size // 2) tokens remain (at least one: with
    block_size 1 the window is the last token alone). Jumping by half a block, not by one token,
    lets the cache serve block_size // 2 tokens before the next rebuild."""
    if length - start <= block_size:
        return start
    return length - max(1, block_size // 2)


class Decoder:
    """A GPT and the KV cache of B sequences that grow together. `feed` gives the logits of the
    positions the cache does not hold yet, `rollback` forgets positions, `reorder` gathers the
    cache rows of chosen sequences; open it with `with` for evaluation mode and no gradients.

    The cache holds the tokens sequence[start : start + fed] of every sequence. Without a KV cache
    (use_kv_cache=False) every call recomputes the whole window and returns the same rows, so that
    the two ways can be compared.
    """

    def __init__(self, model, batch, prompt_length, use_kv_cache=True):
        if not isinstance(model, nn.Module) or not hasattr(model, "new_caches"):
            raise InputTypeError(f"Decoder: expected a GPT, got {type(model).__name__}")
        self.model = model
        self.block = model.config.block_size
        self.batch = batch
        self.start = max(0, prompt_length - self.block)  # a longer prompt starts with its last block_size tokens
        self.fed = 0  # tokens of the window whose keys and values the cache holds
        self.use_kv_cache = use_kv_cache
        self.kernel = self.kernel_weights = None  # the one-token kernel and its copy of the weights, if it runs
        if use_kv_cache:
            # (n_layer, B, Hk, block_size, D) each; None for a model whose blocks keep other state
            # (each layer's cache then holds its own, and the one-token kernel, which reads these two, does not run)
            arrays = model.new_cache_arrays(batch)
            self.keys, self.values = (None, None) if arrays is None else arrays
            self.caches = model.new_caches(batch, arrays)
            if arrays is not None and mt.get_kernels() == "fast":
                # imported here: the kernel is the fast set's, and the readable set never imports it
                from gpt.generation import decode_kernel

                if decode_kernel.can_run(model):
                    self.kernel, self.kernel_weights = decode_kernel, decode_kernel.decode_weights(model)

    def __enter__(self):
        self.was_training = self.model.training
        self.model.eval()
        self.no_grad = mt.no_grad()
        self.no_grad.__enter__()
        return self

    def __exit__(self, *exc):
        self.no_grad.__exit__(*exc)
        self.model.train(self.was_training)

    def start_for(self, length):
        """Where the window of a sequence of `length` tokens starts (the rule, without moving it)."""
        return window_start(length, self.start, self.block)

    def advance(self, length):
        """Apply the rule at `length` tokens: if the window moves, the cache is emptied, to be
        rebuilt from the new window (positions restart at 0) by the next `feed`. The rule must see
        every length in turn; a caller that feeds several tokens at once advances to the first
        length and makes sure the window does not move up to the last."""
        start = self.start_for(length)
        if start != self.start:
            self.start, self.fed = start, 0  # the old window's entries need no clearing: attention reads < length only

    def feed(self, sequences):
        """sequences (B, n) int: every token so far. Applies the rule at length n (`advance`), runs
        the model over the tokens of the window not yet in the cache, and returns their logits
        (B, m, V) (m >= 1 new positions, the last one predicting token n + 1)."""
        n = sequences.shape[1]
        self.advance(n)
        window = sequences[:, self.start :]  # (B, n - start)
        new_tokens = window[:, self.fed :]  # (B, m)
        if new_tokens.shape[1] == 0:
            raise InputError(f"Decoder.feed: the cache already holds all {n} tokens; there is nothing new to score")
        model = self.model
        if not self.use_kv_cache:
            # a few tokens are too little work to share: waking a thread costs more (mt.num_threads)
            with mt.num_threads(1 if window.size <= SINGLE_THREAD_TOKENS else None):
                logits = model(window)[0].data[:, self.fed :]  # (B, m, V)
        elif self.kernel is not None and new_tokens.shape[1] <= KERNEL_TOKENS:
            # a few new tokens per sequence (one per step, a speculative round's k + 1, a short prompt):
            # one kernel over every layer replaces their trip through the modules
            logits = self.kernel.decode(self.kernel_weights, new_tokens, self.fed, self.keys, self.values)  # (B, m, V)
        else:
            self.hold(self.fed)  # a moved window or a rollback starts writing here
            with mt.num_threads(1 if new_tokens.size <= SINGLE_THREAD_TOKENS else None):
                logits = model(new_tokens, caches=self.caches, offset=self.fed)[0].data  # (B, m, V)
        self.hold(window.shape[1])
        return logits

    def feed_greedy(self, sequences, steps):
        """Greedy decoding's inner loop: `feed` the sequences (B, n), then choose `steps` tokens one
        after another, each the argmax of the logits before it (ties: the lower id), and feed each
        but the last. Returns (the chosen tokens (B, steps), the logits each was chosen from
        (B, steps, V)). Under the fast set, when the window holds them all, the whole loop is one
        kernel call (decode_kernel.decode_greedy); otherwise `feed` and an argmax in turn."""
        n = sequences.shape[1]
        self.advance(n)
        new_tokens = sequences[:, self.start + self.fed :]  # (B, m)
        fits = n + steps - 1 - self.start <= self.block  # the window does not move up to the last token fed
        if self.kernel is not None and self.use_kv_cache and fits and 1 <= new_tokens.shape[1] <= KERNEL_TOKENS:
            chosen, logits = self.kernel.decode_greedy(self.kernel_weights, new_tokens, self.fed, steps, self.keys, self.values)
            self.hold(self.fed + new_tokens.shape[1] + steps - 1)
            return chosen, logits
        chosen, logits = [], []
        for step in range(steps):
            if step > 0:
                sequences = np.concatenate([sequences, chosen[-1][:, None]], axis=1)
            logits.append(self.feed(sequences)[:, -1])  # (B, V)
            chosen.append(logits[-1].argmax(axis=-1))
        return np.stack(chosen, axis=1), np.stack(logits, axis=1)

    def rollback(self, length):
        """Keep only the first `length` tokens of the sequences: the cache forgets the positions
        after them (it only lowers `.length`; attention never reads past it)."""
        keep = length - self.start
        if not 0 <= keep <= self.fed:
            raise InputError(
                f"Decoder.rollback: {length} tokens would keep {keep} positions of a window that starts at "
                f"{self.start} and holds {self.fed}; expected between {self.start} and {self.start + self.fed} tokens"
            )
        self.hold(keep)

    def hold(self, fed):
        """The cache holds the window's first `fed` tokens from now on: the count, and each layer
        cache's length (attention reads the positions below it; the next tokens are written there)."""
        self.fed = fed
        if self.use_kv_cache:
            for cache in self.caches:
                cache.length = fed

    def reorder(self, rows):
        """Row r of the cache becomes what row rows[r] was (rows (B',) ints; B' may differ from B)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.use_kv_cache and self.keys is None:
            self.caches = [cache.reordered(rows) for cache in self.caches]  # each layer's own state, gathered
        elif self.use_kv_cache:
            if rows.shape[0] == self.batch:
                held = slice(0, self.fed)  # only the positions the cache holds need moving
                # the right side is gathered into a new array first, so rows may overlap freely
                self.keys[:, :, :, held] = self.keys[:, rows, :, held]  # (n_layer, B, Hk, fed, D)
                self.values[:, :, :, held] = self.values[:, rows, :, held]
            else:
                self.keys, self.values = self.keys[:, rows], self.values[:, rows]  # new arrays of batch B'
                self.caches = self.model.new_caches(rows.shape[0], (self.keys, self.values))
                self.hold(self.fed)
        self.batch = rows.shape[0]


# ================================================================================= checks


def check_ids(where, ids, vocab_size):
    """Every id in [0, vocab_size): the embedding kernels index the table without bounds checks."""
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)].flat[0]
        raise InputError(f"{where}: token id {bad} is outside the vocabulary; ids must be in [0, {vocab_size})")


def check_prompt(where, idx, vocab_size):
    """A prompt (B, T) of integer ids in [0, vocab_size), B >= 1 and T >= 1, as a new int64 array."""
    array = idx.data if isinstance(idx, mt.Tensor) else idx
    try:
        array = np.asarray(array)
    except ValueError:  # ragged nested lists
        raise InputError(f"{where}: idx must be (B, T) integer token ids, got a ragged {type(idx).__name__}") from None
    if array.dtype.kind not in "iu":
        raise InputTypeError(f"{where}: idx must hold integer token ids, got {array.dtype}")
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise InputError(f"{where}: idx must be (B, T) with B >= 1 and T >= 1, got shape {array.shape}")
    check_ids(where, array, vocab_size)
    return np.array(array, dtype=np.int64)


def check_one_sequence(where, prompt_ids, vocab_size):
    """A prompt of one sequence, (T,) or (1, T), as a (1, T) int64 array."""
    array = prompt_ids.data if isinstance(prompt_ids, mt.Tensor) else prompt_ids
    try:
        array = np.asarray(array)
    except ValueError:  # ragged nested lists
        raise InputError(f"{where}: prompt_ids must be one sequence of token ids, (T,) or (1, T)") from None
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2 or array.shape[0] != 1:
        raise InputError(f"{where}: prompt_ids must be one sequence of token ids, (T,) or (1, T), got shape {array.shape}")
    return check_prompt(where, array, vocab_size)


def check_generation_options(where, max_new_tokens, temperature, top_k, top_p, use_kv_cache, seed):
    if not is_integer(max_new_tokens) or max_new_tokens < 0:
        raise InputError(f"{where}: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not is_real_number(temperature) or not (math.isfinite(temperature) and temperature >= 0):
        raise InputError(f"{where}: temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (not is_integer(top_k) or top_k < 1):
        raise InputError(f"{where}: top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not is_real_number(top_p) or not 0 < top_p <= 1):
        raise InputError(f"{where}: top_p must be None or a number in (0, 1], got {top_p!r}")
    if not isinstance(use_kv_cache, (bool, np.bool_)):
        raise InputTypeError(f"{where}: use_kv_cache must be True or False, got {use_kv_cache!r}")
    if seed is not None and (not is_integer(seed) or seed < 0):
        raise InputError(f"{where}: seed must be None or an int >= 0, got {seed!r}")


# ------------------------------------------------------------------------------ compiling ahead


def compile_in_background(model):
    """Start compiling the fast set's one-token kernel for `model` in a second process, and return
    that process for `finish_compiling`; None where nothing is to compile: the readable set or no
    JIT, a model the kernel does not run, or a version already compiled.

    Why. On a first run (an empty compile cache) the kernel takes seconds to compile, at its first
    use. A program that generates after other work (train.py samples once it has trained) starts
    this first, so that the other core compiles it into the cache while this one works; the first
    use then loads it (gpt/generation/decode_kernel.py's `compile_in_background` says how)."""
    if mt.get_kernels() != "fast" or numba.config.DISABLE_JIT or model.new_cache_arrays(1) is None:
        return None
    from gpt.generation import decode_kernel  # the fast set's: the readable set never imports it

    return decode_kernel.compile_in_background(model)


def finish_compiling(process, timeout=600):
    """Wait for a process `compile_in_background` started (None: nothing to wait for). It does not
    matter whether it succeeded: the kernel is loaded from the cache, or compiled, at its first use."""
    if process is None:
        return
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
