"""Greedy text generation with the default recipe, with and without the KV cache, against PyTorch.

One sequence (batch 1) grows from a 1-token prompt to block_size tokens, so the context never
reaches the window rule. Four variants generate the same tokens: microtensor with its KV cache
(with the fast kernel set, whose decode kernel takes each new token through the whole model),
microtensor recomputing the whole context for every token, and the same two in PyTorch
(gpt/checkpoints/torch_gpt.py, with the same weights); where JAX is installed, a fifth: bench/jax_side.py's
jitted one-token step with a KV cache. The case checks that all of them produce the same token
sequence before it times anything.

Each timed run is one whole generation. The variants run in alternation, so a noisy neighbour
slows all of them alike; a figure is the median over the timed runs, and tokens/s is the number of
new tokens over that median.
"""
import statistics
import tempfile
from pathlib import Path

import numpy as np
from harness import alternate, number, ratio, start_jax, start_torch, x

import microtensor as mt
from gpt.model.transformer import GPT, GPTConfig

RECIPE = dict(vocab_size=65, block_size=256, n_layer=4, n_head=4, n_embd=128)
NEW_TOKENS = RECIPE["block_size"] - 1  # from a 1-token prompt up to a full block
VARIANTS = ("microtensor_kv_cache", "microtensor_recompute", "pytorch_kv_cache", "pytorch_recompute", "jax_kv_cache")


def measure(args, machine):
    repeat = args.repeat or 5
    torch_process, jax_process = start_torch(args), start_jax(args)
    mt.manual_seed(0)
    model = GPT(GPTConfig(**RECIPE))
    local = {"microtensor_kv_cache": generator(model, True), "microtensor_recompute": generator(model, False)}
    remote = {}  # name: (peer process, its timed function)
    with tempfile.TemporaryDirectory() as folder:
        weights = Path(folder) / "weights.npz"
        np.savez(weights, **model.state_dict())
        setup = dict(setup="generate", config=model.config.to_dict(), weights=str(weights), new_tokens=NEW_TOKENS)
        if torch_process is not None:
            torch_process.ask(**setup)
            remote["pytorch_kv_cache"] = (torch_process, "generate_kv_cache")
            remote["pytorch_recompute"] = (torch_process, "generate_recompute")
        if jax_process is not None:
            jax_process.ask(**setup)
            remote["jax_kv_cache"] = (jax_process, "generate_kv_cache")
    check_same_tokens(local, remote)  # also the warm-up of each
    times = alternate(local, remote, None, repeat, block=1, warmup=0)
    for process in (torch_process, jax_process):
        if process is not None:
            process.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    results = {}
    for name in VARIANTS:
        seconds = medians.get(name)
        results[f"{name}_s"] = seconds
        results[f"{name}_tokens_per_s"] = None if seconds is None else NEW_TOKENS / seconds
    results["kv_cache_vs_pytorch"] = ratio(medians.get("pytorch_kv_cache"), medians["microtensor_kv_cache"])
    results["kv_cache_vs_jax"] = ratio(medians.get("jax_kv_cache"), medians["microtensor_kv_cache"])
    if jax_process is not None:
        results["jax_version"] = jax_process.hello["jax"]
    results["kv_cache_vs_recompute"] = ratio(medians["microtensor_recompute"], medians["microtensor_kv_cache"])
    results["tokens"] = NEW_TOKENS
    results["repeat"] = repeat
    return {"machine": machine, "generate": results}


def generator(model, use_kv_cache):
    """A function that runs one whole greedy generation in microtensor and returns its tokens."""
    prompt = np.zeros((1, 1), dtype=np.int64)

    def run():
        with mt.using_kernels("fast"):
            out = model.generate(mt.tensor(prompt), NEW_TOKENS, temperature=0, use_kv_cache=use_kv_cache)
        return out.data[0]

    return run


def check_same_tokens(local, remote):
    """Every variant must produce the same greedy sequence, or the timings compare different work.
    At float32 a near-tie between two logits could flip an argmax; that is reported, not hidden."""
    sequences = {name: np.asarray(run()) for name, run in local.items()}
    for name, (process, remote_name) in remote.items():
        sequences[name] = np.asarray(process.ask(call=remote_name))
    reference = sequences["microtensor_kv_cache"]
    for name, tokens in sequences.items():
        if len(tokens) != len(reference):
            raise SystemExit(f"bench generate: {name} made {len(tokens)} tokens, microtensor_kv_cache {len(reference)}")
        differ = np.flatnonzero(tokens != reference)
        if differ.size:
            pos = int(differ[0])
            raise SystemExit(
                f"bench generate: {name} differs from microtensor_kv_cache first at position {pos} "
                f"(token {int(tokens[pos])} vs {int(reference[pos])}; {differ.size} positions differ)"
            )
    print(f"all {len(sequences)} variants generate the same {NEW_TOKENS} tokens")


def result_rows(data):
    g = data["generate"]
    return [
        f"| generation with KV cache, 1→{g.get('tokens', 255) + 1} tokens (tokens/s) | {g['microtensor_kv_cache_tokens_per_s']:,.0f} | "
        f"{number(g.get('pytorch_kv_cache_tokens_per_s'), ',.0f')} | {x(g.get('kv_cache_vs_pytorch'))} | | ≥ 2× |",
        f"| generation recomputing the context (tokens/s) | {g['microtensor_recompute_tokens_per_s']:,.0f} | "
        f"{number(g.get('pytorch_recompute_tokens_per_s'), ',.0f')} | cache {x(g.get('kv_cache_vs_recompute'))} faster | | cache ≥ 5× |",
    ] + ([
        f"| generation with KV cache, JAX {g.get('jax_version', '')} one jitted step per token, in the PyTorch column "
        f"(tokens/s) | {g['microtensor_kv_cache_tokens_per_s']:,.0f} | {number(g.get('jax_kv_cache_tokens_per_s'), ',.0f')} | "
        f"{x(g.get('kv_cache_vs_jax'))} | | ≥ 2× |"
    ] if g.get("jax_kv_cache_tokens_per_s") else [])  # fmt: skip
