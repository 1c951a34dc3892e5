"""Greedy text generation with the default recipe, with and without the KV cache, against PyTorch.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_generate.py [--json FILE]

One sequence (batch 1) grows from a 1-token prompt to block_size tokens, so the context never
reaches the window rule. Four variants generate the same tokens: microtensor with its KV cache
(with the fast kernel set, whose decode kernel takes each new token through the whole model),
microtensor recomputing the whole context for every token, and the same two in PyTorch
(bench/torch_gpt.py, with the same weights). The script checks that all four produce the same token
sequence before it times anything.

Each timed run is one whole generation. The variants run in alternation (PyTorch in a process of
its own: bench/torch_side.py), so a noisy neighbour slows all of them alike; a figure is the median
over the timed runs, and tokens/s is the number of new tokens over that median.
"""
from common import alternate, console, fmt_ratio, fmt_time, machine_info, parser, print_machine, ratio, start_torch, write_json  # isort: skip  (before models: it puts the checkout on sys.path, and tunes the process)
import statistics
import tempfile
from pathlib import Path

import numpy as np
from rich.table import Table

import microtensor as mt
from models.gpt import GPT, GPTConfig

RECIPE = dict(vocab_size=65, block_size=256, n_layer=4, n_head=4, n_embd=128)
NEW_TOKENS = RECIPE["block_size"] - 1  # from a 1-token prompt up to a full block
DEFAULT_REPEAT = 5
KV_VS_PYTORCH_TARGET = 2.0
KV_VS_RECOMPUTE_TARGET = 5.0

VARIANTS = {
    "microtensor_kv_cache": "microtensor, KV cache",
    "microtensor_recompute": "microtensor, recompute",
    "pytorch_kv_cache": "PyTorch, KV cache",
    "pytorch_recompute": "PyTorch, recompute",
}


def ours_generator(model, prompt, use_kv_cache):
    """A function that runs one whole greedy generation in microtensor and returns its tokens."""

    def run():
        with mt.using_kernels("fast"):
            out = model.generate(mt.tensor(prompt), NEW_TOKENS, temperature=0, use_kv_cache=use_kv_cache)
        return out.data[0]

    return run


def build_generators(torch_process, folder):
    """The two microtensor generators, and the PyTorch model with the same weights set up in
    torch_process (its generators are named in the returned dict `remote`)."""
    mt.manual_seed(0)
    model = GPT(GPTConfig(**RECIPE))
    prompt = np.zeros((1, 1), dtype=np.int64)
    local = {
        "microtensor_kv_cache": ours_generator(model, prompt, use_kv_cache=True),
        "microtensor_recompute": ours_generator(model, prompt, use_kv_cache=False),
    }
    remote = {}
    if torch_process is not None:
        weights = Path(folder) / "weights.npz"
        np.savez(weights, **model.state_dict())
        torch_process.ask(setup="generate", config=model.config.to_dict(), weights=str(weights), new_tokens=NEW_TOKENS)
        remote = {"pytorch_kv_cache": "generate_kv_cache", "pytorch_recompute": "generate_recompute"}
    return local, remote


def check_same_tokens(local, remote, torch_process):
    """Every variant must produce the same greedy sequence, or the timings compare different work.
    At float32 a near-tie between two logits could flip an argmax; that is reported, not hidden."""
    sequences = {name: np.asarray(run()) for name, run in local.items()}
    for name, remote_name in remote.items():
        sequences[name] = np.asarray(torch_process.ask(call=remote_name))
    reference_name = "microtensor_kv_cache"
    reference = sequences[reference_name]
    failed = False
    for name, tokens in sequences.items():
        if len(tokens) != len(reference):
            console.print(f"[red]bench_generate: {name} made {len(tokens)} tokens, {reference_name} {len(reference)}[/red]")
            failed = True
            continue
        differ = np.flatnonzero(tokens != reference)
        if differ.size:
            pos = int(differ[0])
            console.print(
                f"[red]bench_generate: {name} differs from {reference_name} first at position {pos} "
                f"(token {int(tokens[pos])} vs {int(reference[pos])}; {differ.size} positions differ)[/red]"
            )
            failed = True
    if failed:
        raise SystemExit(1)
    console.print(f"all {len(sequences)} variants generate the same {NEW_TOKENS} tokens")


def measure(args, repeat):
    torch_process = start_torch(args)
    with tempfile.TemporaryDirectory() as folder:
        local, remote = build_generators(torch_process, folder)
    check_same_tokens(local, remote, torch_process)  # also the warm-up of each
    times = alternate(local, remote, torch_process, repeat, block=1, warmup=0)
    if torch_process is not None:
        torch_process.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    results = {}
    for name in VARIANTS:
        seconds = medians.get(name)
        results[f"{name}_s"] = seconds
        results[f"{name}_tokens_per_s"] = None if seconds is None else NEW_TOKENS / seconds
    results["kv_cache_vs_pytorch"] = ratio(medians.get("pytorch_kv_cache"), medians["microtensor_kv_cache"])
    results["kv_cache_vs_recompute"] = ratio(medians["microtensor_recompute"], medians["microtensor_kv_cache"])
    results["tokens"] = NEW_TOKENS
    results["repeat"] = repeat
    return results


def fmt_rate(tokens_per_s):
    return "-" if tokens_per_s is None else f"{tokens_per_s:,.0f}"


def fmt_target(times):
    return f"≥ {times:g}×"


def show(results):
    title = f"greedy generation: {NEW_TOKENS} new tokens, batch 1, default recipe (medians)"
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("time", justify="right")
    table.add_column("tokens/s", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("target", justify="right")
    for name, label in VARIANTS.items():
        table.add_row(label, fmt_time(results[f"{name}_s"]), fmt_rate(results[f"{name}_tokens_per_s"]), "", "")
    table.add_section()
    table.add_row("KV cache: PyTorch time / ours", "", "", fmt_ratio(results["kv_cache_vs_pytorch"]), fmt_target(KV_VS_PYTORCH_TARGET))
    table.add_row("ours: recompute / KV cache time", "", "", fmt_ratio(results["kv_cache_vs_recompute"]), fmt_target(KV_VS_RECOMPUTE_TARGET))
    console.print(table)


def main():
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args()
    info = machine_info()
    print_machine(info)
    results = measure(args, args.repeat or DEFAULT_REPEAT)
    show(results)
    write_json(args.json, {"machine": info, "generate": results})


if __name__ == "__main__":
    main()
