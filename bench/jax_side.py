"""The JAX side of the benchmarks, in a process of its own (for the reason bench/torch_side.py gives).

The same GPT as gpt/model/transformer.py's default recipe, written as JAX users write one: the
weights a pytree of arrays, the model a pure function of them, `jax.value_and_grad` for the
gradients, and the whole training step (forward, backward, gradient clipping, AdamW) one function
under `jax.jit`. Generation feeds one token at a time to a jitted step that writes its keys and
values into preallocated caches (`lax.dynamic_update_slice`) and masks the positions not yet
written. Only what the default recipe uses is written here (LayerNorm without bias, learned
positions, GELU with tanh, tied output layer, no dropout); another configuration is refused.

The weights come in microtensor's layout (a Linear's weight is (in, out): y = x @ W), which is
also the natural one here. AdamW is PyTorch's and microtensor's: bias-corrected moments, decoupled
weight decay on the matrices only, eps 1e-8; the gradients are first scaled to a global norm of at
most `clip`, as torch.nn.utils.clip_grad_norm_ does (norm / (total + 1e-6)).
"""
import functools
import os

import jax  # isort: skip
import jax.numpy as jnp
import numpy as np
from harness import TIMED, random_batch, serve  # harness puts the checkout on sys.path
from jax import lax

SUPPORTED = {"norm": "layernorm", "mlp": "gelu", "pos": "learned", "tie_weights": True, "bias": False, "dropout": 0.0}


def check_config(config):
    for key, value in SUPPORTED.items():
        if config.get(key) != value:
            raise ValueError(f"jax_side: only the default recipe is written here ({key}={value!r}); got {key}={config.get(key)!r}")
    if config.get("n_kv_head", config["n_head"]) != config["n_head"] or config.get("attention", "standard") != "standard":
        raise ValueError("jax_side: only standard multi-head attention is written here")


def load_params(config, weights):
    """The weights of a microtensor GPT (its state_dict saved by np.savez) as a pytree of float32 arrays."""
    arrays = dict(np.load(weights))
    block = lambda i, name: jnp.asarray(arrays[f"transformer.h.{i}.{name}"])  # noqa: E731
    return {
        "wte": jnp.asarray(arrays["transformer.wte.weight"]),  # (V, C), also the output layer
        "wpe": jnp.asarray(arrays["transformer.wpe.weight"]),  # (block_size, C)
        "ln_f": jnp.asarray(arrays["transformer.ln_f.weight"]),
        "blocks": [
            {name: block(i, name + ".weight") for name in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")}
            for i in range(config["n_layer"])
        ],
    }


def layer_norm(x, weight):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(variance + 1e-5) * weight


def gelu_tanh(x):
    return 0.5 * x * (1 + jnp.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def attention(q, k, v, mask):
    """q (B, H, Tq, D) against k, v (B, H, Tk, D); mask (Tq, Tk) True where a query may see a key."""
    scores = q @ jnp.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    scores = jnp.where(mask, scores, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1) @ v  # (B, H, Tq, D)


def split_heads(x, n_head):
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)  # (B, H, T, D)


def merge_heads(y):
    B, H, T, D = y.shape
    return y.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def block_forward(p, x, n_head, attend):
    """One pre-norm block; attend(q, k, v) -> (B, H, T, D) is the attention over what it sees."""
    qkv = layer_norm(x, p["ln_1"]) @ p["attn.c_attn"]  # (B, T, 3C)
    q, k, v = (split_heads(t, n_head) for t in jnp.split(qkv, 3, axis=-1))
    x = x + merge_heads(attend(q, k, v)) @ p["attn.c_proj"]
    return x + gelu_tanh(layer_norm(x, p["ln_2"]) @ p["mlp.c_fc"]) @ p["mlp.c_proj"]


def loss_of(params, idx, targets, n_head):
    T = idx.shape[1]
    x = params["wte"][idx] + params["wpe"][:T]  # (B, T, C)
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    for p in params["blocks"]:
        x = block_forward(p, x, n_head, lambda q, k, v: attention(q, k, v, causal))
    logits = layer_norm(x, params["ln_f"]) @ params["wte"].T  # (B, T, V)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(log_probs, targets[..., None], axis=-1).mean()


@functools.partial(jax.jit, static_argnames=("n_head", "lr", "weight_decay", "betas", "clip"), donate_argnums=(0, 1))
def train_step(params, opt_state, idx, targets, *, n_head, lr, weight_decay, betas, clip):
    """One whole training step: (loss, new params, new optimizer state)."""
    loss, grads = jax.value_and_grad(loss_of)(params, idx, targets, n_head)
    leaves = jax.tree_util.tree_leaves(grads)
    total = jnp.sqrt(sum(jnp.sum(g * g) for g in leaves))
    scale = jnp.minimum(1.0, clip / (total + 1e-6))
    beta1, beta2 = betas
    t = opt_state["t"] + 1
    correction1, correction2 = 1 - beta1**t, 1 - beta2**t

    def update(p, g, m, v):
        g = g * scale
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        decay = weight_decay if p.ndim >= 2 else 0.0  # matrices only, as weight_decay_groups
        p = p - lr * ((m / correction1) / (jnp.sqrt(v / correction2) + 1e-8) + decay * p)
        return p, m, v

    updated = jax.tree_util.tree_map(update, params, grads, opt_state["m"], opt_state["v"])
    is_triple = lambda node: isinstance(node, tuple)  # noqa: E731
    pick = lambda i: jax.tree_util.tree_map(lambda triple: triple[i], updated, is_leaf=is_triple)  # noqa: E731
    return loss, pick(0), {"t": t, "m": pick(1), "v": pick(2)}


def setup_train(config, weights, batch_size, seed, lr, weight_decay, betas, clip):
    """The jitted training step ("train_step"), compiled now by its first step; returns that step's loss."""
    check_config(config)
    state = {"params": load_params(config, weights)}
    zeros = jax.tree_util.tree_map(jnp.zeros_like, state["params"])
    state["opt"] = {"t": jnp.zeros((), jnp.int32), "m": zeros, "v": jax.tree_util.tree_map(jnp.zeros_like, zeros)}
    rng = np.random.default_rng(seed)
    hyper = dict(n_head=config["n_head"], lr=lr, weight_decay=weight_decay, betas=tuple(betas), clip=clip)
    losses = []

    def step():
        x, y = random_batch(rng, batch_size, config["block_size"], config["vocab_size"])
        loss, state["params"], state["opt"] = train_step(state["params"], state["opt"], jnp.asarray(x), jnp.asarray(y), **hyper)
        losses.append(float(loss))  # waits for the step: JAX returns before it has run

    TIMED["train_step"] = step
    step()
    return {"first_loss": losses[0]}


def setup_generate(config, weights, new_tokens):
    """Greedy generation from a 1-token prompt, one jitted step per token with a KV cache ("generate_kv_cache")."""
    check_config(config)
    params = load_params(config, weights)
    L, H, S, C = config["n_layer"], config["n_head"], config["block_size"], config["n_embd"]

    @functools.partial(jax.jit, donate_argnums=(1,))
    def decode_step(params, caches, token, position):
        """Logits (V,) after `token` at `position`, and the caches with its keys and values written."""
        x = (params["wte"][token] + params["wpe"][position])[None, None, :]  # (1, 1, C)
        sees = (jnp.arange(S) <= position)[None, :]  # (1, S): the keys written so far, this one included
        new_caches = []
        for p, (k_cache, v_cache) in zip(params["blocks"], caches):

            def attend(q, k, v, k_cache=k_cache, v_cache=v_cache):
                k_all = lax.dynamic_update_slice(k_cache, k, (0, 0, position, 0))  # (1, H, S, D)
                v_all = lax.dynamic_update_slice(v_cache, v, (0, 0, position, 0))
                new_caches.append((k_all, v_all))
                return attention(q, k_all, v_all, sees)

            x = block_forward(p, x, H, attend)
        logits = layer_norm(x, params["ln_f"])[0, 0] @ params["wte"].T
        return logits, new_caches

    def generate():
        caches = [(jnp.zeros((1, H, S, C // H)), jnp.zeros((1, H, S, C // H))) for _ in range(L)]
        tokens = [0]
        for position in range(new_tokens):
            logits, caches = decode_step(params, caches, tokens[-1], position)
            tokens.append(int(jnp.argmax(logits)))  # waits for the step, as the next one needs the token
        return tokens

    TIMED["generate_kv_cache"] = generate
    generate()  # compiles the step
    return {}


SETUPS = {"train": setup_train, "generate": setup_generate}


def main():
    serve({"jax": jax.__version__, "threads": os.cpu_count()}, SETUPS)


if __name__ == "__main__":
    main()
