"""Generation speed of the transformer variants, with the fast set's decode kernel and without it.

The default recipe's shapes (4 layers, 4 heads, 128 wide, block 64, vocabulary 65) with random
weights (the initialization), greedy generation of 200 tokens from a 1-token prompt, batch 1, with
the KV cache, under the fast kernel set. Each variant changes one option of the baseline (learned
positions, 4 key/value heads, the GELU MLP): ALiBi positions, one key/value head (multi-query), a
mixture of 4 experts with 2 per token. Each runs two ways: "kernel", where every one-token step is
one call of gpt/generation/decode_kernel.py, and "fallback", where `decode_kernel_fits` is made to say
no (harness.decode_kernel_off), so every step goes through the modules (the path these options took before the kernel
covered them). 200 tokens pass block_size, so both also rebuild the cache through the modules
every 32 tokens (the window rule).

Before timing, the case checks that both ways generate the same tokens. The runs alternate
between all eight (variant, way) pairs, so a noisy neighbour slows all of them alike; a figure is
the median over `--repeat` runs, and tokens/s is 200 over that median.
"""
import statistics

import numpy as np
from harness import conditions_line, decode_kernel_off, in_turns

import microtensor as mt
from gpt.generation import decode_kernel
from gpt.model.transformer import GPT, GPTConfig

RECIPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
NEW_TOKENS = 200
VARIANTS = {
    "baseline": dict(),  # learned positions, n_kv_head 4, GELU MLP
    "alibi": dict(pos="alibi"),
    "n_kv_head_1": dict(n_kv_head=1),
    "moe": dict(mlp="moe", n_expert=4, expert_top_k=2),
}
LABELS = {
    "baseline": "baseline (learned, n_kv_head 4, gelu)",
    "alibi": "pos alibi",
    "n_kv_head_1": "n_kv_head 1",
    "moe": "mlp moe (E 4, k 2)",
}
WAYS = ("kernel", "fallback")


def generator(model, way):
    """A function that runs one whole greedy generation and returns its tokens (NEW_TOKENS,)."""
    prompt = np.zeros((1, 1), dtype=np.int64)

    def run():
        with mt.using_kernels("fast"):
            if way == "kernel":
                return model.generate(prompt, NEW_TOKENS, temperature=0, use_kv_cache=True).data[0, 1:]
            with decode_kernel_off():
                return model.generate(prompt, NEW_TOKENS, temperature=0, use_kv_cache=True).data[0, 1:]

    return run


def build():
    """{(variant, way): generator}, and checks that the kernel serves every variant."""
    runs = {}
    for name, options in VARIANTS.items():
        mt.manual_seed(0)
        model = GPT(GPTConfig(**RECIPE, **options))
        if not decode_kernel.decode_kernel_fits(model.config):
            raise SystemExit(f"bench decode_variants: decode_kernel_fits says no to {name}; there is no kernel to measure")
        for way in WAYS:
            runs[name, way] = generator(model, way)
    return runs


def check_same_tokens(runs):
    """Both ways of a variant must generate the same greedy tokens, or they time different work
    (also the warm-up: the first run compiles)."""
    for name in VARIANTS:
        kernel, fallback = runs[name, "kernel"](), runs[name, "fallback"]()
        differ = np.flatnonzero(kernel != fallback)
        if differ.size:
            raise SystemExit(
                f"bench decode_variants: {name}: the kernel and the fallback differ first at token {int(differ[0])} "
                f"({int(kernel[differ[0]])} vs {int(fallback[differ[0]])}; {differ.size} tokens differ)"
            )
    print(f"kernel and fallback generate the same {NEW_TOKENS} tokens for each of {len(VARIANTS)} variants")


def measure(args, machine):
    repeat = args.repeat or 5
    settings = {"recipe": RECIPE, "variants": VARIANTS, "tokens": NEW_TOKENS, "repeat": repeat}
    return {"machine": machine, "settings": settings, "decode_variants": measure_variants(repeat)}


def measure_variants(repeat):
    runs = build()
    check_same_tokens(runs)
    times = in_turns(runs, repeat)
    results = {}
    for name in VARIANTS:
        row = {}
        for way in WAYS:
            seconds = statistics.median(times[name, way])
            row[f"{way}_s"] = seconds
            row[f"{way}_tokens_per_s"] = NEW_TOKENS / seconds
            row[f"{way}_runs_s"] = times[name, way]
        row["kernel_vs_fallback"] = row["fallback_s"] / row["kernel_s"]
        results[name] = row
    return results


def markdown(data):
    """The table of a run's JSON (the dict measure() returns), and the conditions it ran under."""
    settings = data["settings"]
    lines = [
        f"Greedy generation, {settings['tokens']} tokens, batch 1, KV cache, fast set; medians of {settings['repeat']} runs:",
        "",
        "| variant | kernel tokens/s | fallback tokens/s | kernel / fallback |",
        "|---|---:|---:|---:|",
    ]
    for name, row in data["decode_variants"].items():
        lines.append(
            f"| {LABELS.get(name, name)} | {row['kernel_tokens_per_s']:,.0f} | {row['fallback_tokens_per_s']:,.0f} | {row['kernel_vs_fallback']:.1f}× |"
        )
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)
