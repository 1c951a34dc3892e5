"""The checks of exercise 23. Run them with `python -m exercises check multi_token_loss`."""
import numpy as np

import microtensor as mt
from exercises.checking import expect, expect_close, gradcheck, random_tensor
from gpt.model.electives import mtp
from gpt.model.transformer import GPT, GPTConfig


def numpy_cross_entropy(logits, targets):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    rows = logp.reshape(-1, logp.shape[-1])
    return -rows[np.arange(rows.shape[0]), targets.reshape(-1)].mean()


def test_each_head_against_numpy(impl):
    """head_loss(logits, targets, k) is the mean cross-entropy of positions 0 .. T - k against targets[:, k - 1:]"""
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 5, (2, 6))
    for k in (1, 2, 3, 6):
        logits = random_tensor((2, 6, 5), seed=k)
        expected = numpy_cross_entropy(logits.numpy()[:, : 6 - k + 1], targets[:, k - 1 :])
        got = impl.head_loss(logits, mt.tensor(targets), k)
        expect(got is not None, f"head_loss(k={k}) with T = 6 returned None: {6 - k + 1} positions have a target")
        expect_close(f"head_loss(k={k}), T = 6", got.numpy(), expected, "numpy, positions 0 .. T - k against targets[:, k - 1:]")


def test_positions_without_a_target_are_left_out(impl):
    """changing head k's logits at its last k - 1 positions changes nothing; T < k gives None"""
    targets = mt.tensor(np.random.default_rng(1).integers(0, 5, (2, 6)))
    logits = random_tensor((2, 6, 5), seed=7)
    changed = logits.numpy().copy()
    changed[:, 4:] += 3.0  # positions 4 and 5: no token 3 places ahead inside the sequence
    before = impl.head_loss(logits, targets, 3).numpy()
    after = impl.head_loss(mt.tensor(changed), targets, 3).numpy()
    expect(before == after, f"head_loss(k=3) moved from {before} to {after} when only positions 4 and 5 changed: they have no target")
    expect(impl.head_loss(random_tensor((2, 2, 5), seed=8), mt.tensor(np.zeros((2, 2), dtype=np.int64)), 3) is None,
           "head_loss(k=3) of a sequence of 2 tokens must be None: no position has a token 3 places ahead")  # fmt: skip


def test_the_sum_equals_the_model_s_loss(impl):
    """multi_token_loss of a GPT's three heads equals the loss of GPT(mtp=3), plain and weighted"""
    for weights in (None, "1,0.5,0.25"):
        mt.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=7, n_layer=1, n_head=2, n_embd=8, block_size=8, mtp=3, mtp_weights=weights), dtype=mt.float64)
        rng = np.random.default_rng(2)
        x, y = mt.tensor(rng.integers(0, 7, (2, 8))), mt.tensor(rng.integers(0, 7, (2, 8)))
        _, loss = model(x, y)
        hidden = model.trunk(x)
        heads = [mtp.head_logits(model, hidden, k) for k in (1, 2, 3)]
        w = None if weights is None else [1.0, 0.5, 0.25]
        expect_close(f"multi_token_loss, weights {w}", impl.multi_token_loss(heads, y, w).numpy(), loss.numpy(), "GPT(mtp=3)'s loss (gpt/model/electives/mtp.py)")


def test_gradients_match_finite_differences(impl):
    """gradcheck through multi_token_loss of three heads' logits, weighted"""
    targets = mt.tensor(np.random.default_rng(3).integers(0, 4, (2, 5)))
    heads = [random_tensor((2, 5, 4), seed=10 + k) for k in range(3)]
    gradcheck(lambda *logits: impl.multi_token_loss(list(logits), targets, [1.0, 0.5, 2.0]), heads)
