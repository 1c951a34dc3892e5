"""The checks of exercise 22. Run them with `python -m exercises check checkpointing`."""
import numpy as np

import microtensor as mt
import microtensor.functional as F
from exercises.checking import CheckFailed, expect, gradcheck, random_tensor


def make_blocks(n, width=6, p=0.3, seed=0):
    """n residual blocks x + dropout(gelu(x W_i)), each W_i (width, width) a parameter fn closes over."""
    weights = [random_tensor((width, width), seed=seed + i, low=-0.5, high=0.5) for i in range(n)]

    def block_of(weight):
        return lambda x: x + F.dropout(F.gelu(x @ weight), p)

    return [block_of(w) for w in weights], weights


def gradients(run, x, weights, seed=7):
    """run(x) -> y; the loss sum(y · u) for a fixed random u; returns (y, dL/dx, [dL/dW_i]) as copies."""
    for t in (x, *weights):
        t.grad = None
    mt.manual_seed(seed)  # the same dropout masks for every run
    y = run(x)
    upstream = mt.tensor(np.random.default_rng(3).standard_normal(y.shape))
    (y * upstream).sum().backward()
    grads = [None if t.grad is None else t.grad.copy() for t in (x, *weights)]
    for t in (x, *weights):
        t.grad = None
    return y.numpy().copy(), grads[0], grads[1:]


def compare(what, mine, plain):
    y, dx, dws = mine
    y_plain, dx_plain, dws_plain = plain
    expect(np.array_equal(y, y_plain), f"{what}: y differs from the blocks run without checkpointing (the forward is given: is fn run as written?)")
    expect(dx is not None, f"{what}: x got no gradient: backward must return the new leaf's .grad as x's gradient")
    missing = [i for i, g in enumerate(dws) if g is None]
    expect(not missing, f"{what}: the weights {missing} got no gradient: call backward on the second run's output, "
                        "whose walk fills the .grad of the parameters fn uses")  # fmt: skip
    if not np.array_equal(dx, dx_plain) or not all(np.array_equal(a, b) for a, b in zip(dws, dws_plain)):
        worst = max(np.max(np.abs(a - b)) for a, b in zip((dx, *dws), (dx_plain, *dws_plain)))
        raise CheckFailed(
            f"{what}: the gradients differ from those without checkpointing (by up to {worst:.3g}); they must be equal "
            "bit for bit. Is the generator set back to forward's state before the second run of fn "
            "(random.set_state(ctx.generator_state))? And in checkpoint_sequential, does each segment's function still "
            "run its own blocks when backward calls it, after the loop has moved on (a closure reads a loop variable late)?"
        )


def test_one_checkpoint_gives_the_same_gradients(impl):
    """checkpoint(fn, x): the same y and the same gradients, bit for bit, dropout masks included"""
    blocks, weights = make_blocks(2)
    x = random_tensor((4, 6), seed=20)

    def run_blocks(x):
        for block in blocks:
            x = block(x)
        return x

    compare("checkpoint(two blocks, x)", gradients(lambda x: impl.checkpoint(run_blocks, x), x, weights), gradients(run_blocks, x, weights))


def test_gradients_match_finite_differences(impl):
    """gradcheck: x and a weight fn uses, random upstream gradient"""
    x, w = random_tensor((3, 4), seed=1), random_tensor((4, 4), seed=2)
    gradcheck(lambda x, w: impl.checkpoint(lambda a: (a @ w).tanh() * a, x), [x, w])


def test_the_callers_random_state_is_given_back(impl):
    """after backward, the generator is where the caller left it: later draws are not changed"""
    x = random_tensor((50, 8), seed=4)
    mt.manual_seed(1)
    y = impl.checkpoint(lambda x: F.dropout(x, 0.5), x)
    after_forward = mt.get_generator().random(4)
    y.sum().backward()
    after_backward = mt.get_generator().random(4)
    mt.manual_seed(1)
    F.dropout(x.detach(), 0.5)
    expect(np.array_equal(after_forward, mt.get_generator().random(4)), "forward changed what the caller draws next (the forward is given: was it changed?)")
    expect(np.array_equal(after_backward, mt.get_generator().random(4)),
           "after backward the caller's next draws differ from those without checkpointing: save the state before "
           "setting forward's (random.get_state()), and set it back after the second run of fn")  # fmt: skip


def test_sequential_checkpoints_every_square_root_of_n_blocks(impl):
    """checkpoint_sequential: ⌈N / ⌊√N⌋⌉ Checkpoint nodes, and the same gradients"""
    for n, segments in ((9, 3), (10, 4), (1, 1), (5, 3)):
        blocks, weights = make_blocks(n, seed=10 * n)
        x = random_tensor((3, 6), seed=n)
        mt.manual_seed(0)
        y = impl.checkpoint_sequential(blocks, x)
        ops = [t.grad_fn.name for t in mt.autograd.topological_order(y) if t.grad_fn is not None]
        expect(ops == ["Checkpoint"] * segments,
               f"checkpoint_sequential of {n} blocks: the graph's ops are {ops}; expected {segments} Checkpoint nodes "
               f"and nothing else (segments of ⌊√{n}⌋ = {max(1, int(np.sqrt(n)))} blocks, the last one shorter)")  # fmt: skip

        def plain(x, blocks=blocks):
            for block in blocks:
                x = block(x)
            return x

        compare(f"checkpoint_sequential of {n} blocks", gradients(lambda x: impl.checkpoint_sequential(blocks, x), x, weights), gradients(plain, x, weights))
