"""The PyTorch side of the benchmarks, in a process of its own.

A process has one OpenMP runtime, shared by PyTorch and by Numba's parallel kernels, and the
benchmarks tune how long its threads spin after a kernel as train.py does
(microtensor.fast.process.tune_for_training). In one process PyTorch would run with microtensor's
setting or microtensor with PyTorch's, each slower than with its own. So a case that compares with
PyTorch starts this script with the environment its process was started with, before the tuning,
and asks it, one JSON line at a time on stdin/stdout, to build the PyTorch version of what it
measures (gpt/checkpoints/torch_gpt.py's GPT, or an op) and to time blocks of calls, alternating with
blocks of its own (harness.PeerProcess; the requests are those of harness.serve). A timed function
that returns a tuple gives its own phase timings; any other is timed by harness.serve.
"""
import torch  # isort: skip  (first, with its own defaults: see above)
import time

import numpy as np
from harness import TIMED, float_inputs, integer_inputs, random_batch, serve  # harness puts the checkout on sys.path

from gpt.checkpoints import torch_gpt

def setup_train(config, weights, batch_size, seed, lr, weight_decay, betas, clip, compiled=False):
    """The training step, run eagerly ("train_step") or with torch.compile ("train_step_compiled",
    compiled now, by this first step); returns the loss of the first batch (the caller compares it
    with its own)."""
    model = torch_gpt.from_arrays(config, dict(np.load(weights)))
    forward = torch.compile(model) if compiled else model
    decay = [p for p in model.parameters() if p.dim() >= 2]  # decay on matrices only, as microtensor.optim.weight_decay_groups
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas))
    rng = np.random.default_rng(seed)
    losses = []

    def step():
        x, y = random_batch(rng, batch_size, config["block_size"], config["vocab_size"])
        t0 = time.perf_counter()
        _, loss = forward(torch.from_numpy(x), torch.from_numpy(y))
        losses.append(loss.item())
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        t3 = time.perf_counter()
        return (t1 - t0, t2 - t1, t3 - t2)

    TIMED["train_step_compiled" if compiled else "train_step"] = step
    step()
    return {"first_loss": losses[0]}


def setup_generate(config, weights, new_tokens):
    """Greedy generation from a 1-token prompt, with the KV cache and recomputing every token."""
    model = torch_gpt.from_arrays(config, dict(np.load(weights)))
    model.eval()

    def generate(use_kv_cache):
        with torch.inference_mode():
            idx = torch.zeros((1, 1), dtype=torch.int64)
            caches = model.new_caches(1) if use_kv_cache else None
            fed = 0
            for _ in range(new_tokens):
                if use_kv_cache:  # the tokens not yet in the cache, at the positions after them
                    logits, _ = model(idx[:, fed:], caches=caches, offset=fed)
                    fed = idx.shape[1]
                else:
                    logits, _ = model(idx)
                token = logits[:, -1].argmax(dim=-1, keepdim=True)
                idx = torch.cat([idx, token], dim=1)
        return idx[0].tolist()

    TIMED["generate_kv_cache"] = lambda: generate(True)
    TIMED["generate_recompute"] = lambda: generate(False)
    return {}


def _torch_op(kind, dims):
    """The PyTorch function of one op of bench/cases/ops.py, taking its float inputs as tensors."""
    tf = torch.nn.functional
    if kind == "matmul":
        return lambda a, b: a @ b
    if kind == "softmax":
        return lambda x: torch.softmax(x, dim=-1)
    if kind == "layer_norm":
        return lambda x, w, b: tf.layer_norm(x, (dims[-1],), w, b)
    if kind == "rms_norm":
        return lambda x, w: tf.rms_norm(x, (dims[-1],), w, eps=1e-5)
    if kind == "gelu_tanh":
        return lambda x: tf.gelu(x, approximate="tanh")
    if kind == "gelu_erf":
        return lambda x: tf.gelu(x)
    if kind == "silu":
        return tf.silu
    if kind == "attention":
        return lambda q, k, v: tf.scaled_dot_product_attention(q, k, v, is_causal=True)
    if kind == "cross_entropy":
        targets = torch.from_numpy(integer_inputs(1, dims[-1], dims[0]))
        return lambda x: tf.cross_entropy(x, targets)
    if kind == "embedding":
        ids = torch.from_numpy(integer_inputs(1, dims[0], (12, 64)))
        return lambda w: tf.embedding(ids, w)
    raise ValueError(f"torch_side: unknown op {kind!r}")


def setup_op(name, kind, shapes, seed):
    """`name`/forward and `name`/forward_backward for one op on the inputs bench/cases/ops.py uses."""
    fn = _torch_op(kind, shapes[0])
    inputs = [torch.tensor(a, requires_grad=True) for a in float_inputs(seed, shapes)]
    out_shape = tuple(fn(*inputs).shape)
    upstream = torch.from_numpy(float_inputs(seed + 1, [out_shape])[0])

    def forward():
        with torch.no_grad():
            fn(*inputs)

    def forward_backward():
        fn(*inputs).backward(upstream)
        for t in inputs:
            t.grad = None

    TIMED[f"{name}/forward"] = forward
    TIMED[f"{name}/forward_backward"] = forward_backward
    return {}


def setup_adamw(shapes, seed, lr, weight_decay, betas):
    params = [torch.tensor(a, requires_grad=True) for a in float_inputs(seed, shapes)]
    for p, g in zip(params, float_inputs(seed + 1, shapes)):
        p.grad = torch.from_numpy(g)
    optimizer = torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    TIMED["adamw_step"] = optimizer.step
    return {}


SETUPS = {"train": setup_train, "generate": setup_generate, "op": setup_op, "adamw": setup_adamw}


def main():
    serve({"torch": torch.__version__, "threads": torch.get_num_threads()}, SETUPS)


if __name__ == "__main__":
    main()
