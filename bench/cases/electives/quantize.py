"""int8 and int4 weights (gpt/model/electives/quantize.py) against float32: bytes, validation loss, generation speed.

    python bench/run.py quantize [--iters 500] [--checkpoint DIR] [--retrain]

Trains the default recipe (4 layers, 4 heads, 128 wide, block 64) briefly with train.py in a
subprocess (--iters, default 500) on ../shared/data/tinyshakespeare.txt, in a folder of the
temporary directory that a second run with the same settings reuses (--retrain trains again; or
--checkpoint DIR uses a checkpoint of train.py's). Then, for the float32 model, the same weights
quantized to int8 (one scale per output channel) and to int4 (one scale per group of --group-size
input rows):

- weight bytes: the codes and scales, plus the parameters left in float32 (norms), against float32;
- validation loss over the whole validation split (its last 10%, as train.py splits it), cut into
  windows of block_size tokens that do not overlap, and bits per character (loss / ln 2, one
  character per token);
- generation: 200 new tokens, greedy, with the KV cache, from a newline, batch 1, the fast kernel
  set; the median of --repeat runs (default 3) after a warm-up run, the variants taken in turn.
  Each model's steps run the fast set's decode kernel (the whole model in one call; a quantized
  model's codes are read by the kernel and dequantized inside its products), and again through
  the modules (the decode kernel switched off by harness.decode_kernel_off), each Linear its
  quantized product. With block_size 64, every variant feeds its last 32 tokens through the modules
  again each time the window passes block_size (gpt/generation/decoder.py's window rule): that is
  in every time. Also: where the greedy tokens first differ from float32's (once one token
  differs, the texts go separate ways, so the count of equal tokens after it says little).
- generation speed at larger sizes, where the float32 weights outgrow a core's L2 cache: nanoGPT's
  character model (6 layers, 6 heads, 384 wide) and the default recipe, both with block 256 and
  randomly initialized weights (speed does not depend on training), 255 greedy tokens from one
  token through the decode kernel, float32 against int8 and int4, in turns.
"""
import math
import statistics
import tempfile
from pathlib import Path

import numpy as np
from harness import TINYSHAKESPEARE, conditions_line, decode_kernel_off, in_turns, trained_checkpoint, trained_model

import microtensor as mt
from gpt.model.transformer import GPT, GPTConfig
from gpt.text.data import Batches, load_text
from gpt.model.electives.quantize import quantize_model, weight_bytes

NEW_TOKENS = 200
SIZES = {"default recipe, block 256": dict(n_layer=4, n_head=4, n_embd=128), "nanoGPT 6L/6H/384, block 256": dict(n_layer=6, n_head=6, n_embd=384)}
EVAL_WINDOWS_PER_BATCH = 32


def checkpoint_folder(args):
    """The checkpoint folder: --checkpoint, or one trained now (or earlier with the same command)."""
    if args.checkpoint:
        return Path(args.checkpoint)
    return trained_checkpoint(Path(args.cache_dir) / "default-recipe", args.data, args.iters, retrain=args.retrain)


def load(folder, bits=None, group_size=None):
    """The checkpoint's model in float32, or quantized to `bits`; and its tokenizer."""
    model, tokenizer, _ = trained_model(folder)
    if bits is not None:
        quantize_model(model, bits, group_size)
    return model, tokenizer


def val_loss(model, val_ids):
    """Mean cross-entropy per token over the validation split, in windows of block_size that do not
    overlap (the last, incomplete window left out)."""
    T = model.config.block_size
    windows = (len(val_ids) - 1) // T
    x = val_ids[: windows * T].reshape(windows, T).astype(np.int64)
    y = val_ids[1 : windows * T + 1].reshape(windows, T).astype(np.int64)
    total = 0.0
    with mt.no_grad(), mt.using_kernels("fast"):
        for start in range(0, windows, EVAL_WINDOWS_PER_BATCH):
            xb, yb = x[start : start + EVAL_WINDOWS_PER_BATCH], y[start : start + EVAL_WINDOWS_PER_BATCH]
            total += model(xb, yb)[1].item() * xb.size
    return total / (windows * T), windows * T


def generator(model, prompt, decode_kernel):
    def run():
        with mt.using_kernels("fast"):
            if decode_kernel:
                return model.generate(prompt, NEW_TOKENS, temperature=0).data[0]
            with decode_kernel_off():
                return model.generate(prompt, NEW_TOKENS, temperature=0).data[0]

    return run


def speed_at(options, group_size, repeat):
    """tokens/s of float32, int8 and int4 through the decode kernel for a random model of these
    options, 255 greedy tokens from one, the variants in turns; and each one's ratio to float32."""
    config = GPTConfig(vocab_size=65, block_size=256, **options)
    models = {}
    for name, bits, group in (("float32", None, None), ("int8", 8, None), ("int4", 4, group_size)):
        mt.manual_seed(0)
        models[name] = GPT(config)
        if bits is not None:
            quantize_model(models[name], bits, group)
    prompt = mt.tensor(np.zeros((1, 1), dtype=np.int64))

    def run(model):
        def generate():
            with mt.using_kernels("fast"):
                return model.generate(prompt, config.block_size - 1, temperature=0)

        return generate

    runs = {name: run(model) for name, model in models.items()}
    for generate in runs.values():
        generate()  # the warm-up
    times = in_turns(runs, repeat)
    medians = {name: statistics.median(values) for name, values in times.items()}
    weight_mb = {name: weight_bytes(model)["total"] / 1e6 for name, model in models.items()}
    return {
        name: {"tokens_per_s": (config.block_size - 1) / medians[name], "vs_float32": medians["float32"] / medians[name], "weight_mb": weight_mb[name]}
        for name in models
    }


def options(p):
    p.add_argument("--data", default=str(TINYSHAKESPEARE), help="text to train on and to take the validation split from")
    p.add_argument("--iters", type=int, default=500, help="training steps of the model")
    p.add_argument("--group-size", type=int, default=32, help="int4: input rows per scale")
    p.add_argument("--checkpoint", default=None, help="a folder with a train.py checkpoint to use instead of training")
    p.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "microtensor-bench-quantize"), help="where the trained model is kept")
    p.add_argument("--retrain", action="store_true", help="train again even if the cache folder holds the model")


def measure(args, machine):
    repeat = args.repeat or 3
    folder = checkpoint_folder(args)

    variants = {  # name: (bits, group_size)
        "float32": (None, None),
        "int8": (8, None),
        "int4": (4, args.group_size),
    }
    models_, rows = {}, {}
    tokenizer = None
    for name, (bits, group_size) in variants.items():
        models_[name], tokenizer = load(folder, bits, group_size)
    text = load_text(args.data)
    ids = tokenizer.encode(text, dtype=tokenizer.id_dtype)
    val_ids = Batches(ids, models_["float32"].config.block_size).splits["val"]
    for name, model in models_.items():
        loss, tokens = val_loss(model, val_ids)
        rows[name] = {"bits": variants[name][0] or 32, "group_size": variants[name][1], "weight_bytes": weight_bytes(model),
                      "val_loss": loss, "val_tokens": tokens, "bits_per_character": loss / math.log(2)}  # fmt: skip
        print(f"{name}: val loss {loss:.4f} over {tokens} tokens")

    newline = tokenizer.encode("\n")
    prompt = mt.tensor(np.array([newline], dtype=np.int64))
    runs = {f"{name}, {path}": generator(models_[name], prompt, decode_kernel=path == "decode kernel") for name in variants for path in ("decode kernel", "modules")}
    tokens = {name: np.asarray(run()) for name, run in runs.items()}  # also the warm-up
    times = in_turns(runs, repeat)
    reference = tokens["float32, decode kernel"]
    if not np.array_equal(tokens["float32, modules"], reference):
        raise SystemExit("bench_quantize: float32 generates different tokens through the modules and through the decode kernel")
    generation = {}
    for name in runs:
        seconds = statistics.median(times[name])
        differ = np.flatnonzero(tokens[name][-NEW_TOKENS:] != reference[-NEW_TOKENS:])
        generation[name] = {
            "median_s": seconds, "tokens_per_s": NEW_TOKENS / seconds, "times_s": times[name],
            "first_token_differing_from_float32": int(differ[0]) if differ.size else None,
        }  # fmt: skip
    sample = {name: tokenizer.decode(tokens[name][-NEW_TOKENS:][:80]) for name in ("float32, decode kernel", "int8, decode kernel", "int4, decode kernel")}
    for name in variants:
        if not np.array_equal(tokens[f"{name}, modules"], tokens[f"{name}, decode kernel"]):
            raise SystemExit(f"bench_quantize: {name} generates different tokens through the modules and through the decode kernel")
    sizes = {size: speed_at(options, args.group_size, repeat) for size, options in SIZES.items()}

    results = {
        "checkpoint": folder.name, "iters": args.iters, "group_size": args.group_size, "new_tokens": NEW_TOKENS, "repeat": repeat,
        "models": rows, "generation": generation, "samples": sample, "sizes": sizes,
    }  # fmt: skip
    return {"machine": machine, "quantize": results}


def markdown(data):
    """The tables of a run's JSON (the dict measure() returns), and the conditions they ran under."""
    results = data["quantize"]
    rows, generation = results["models"], results["generation"]
    if "int8, decode kernel" not in generation:
        return markdown_before_kernel_codes(data)
    float_bytes = rows["float32"]["weight_bytes"]["total"]
    lines = [
        (
            f"The default recipe after {results['iters']} training steps: val loss over {rows['float32']['val_tokens']:,} validation tokens; "
            f"{results['new_tokens']} greedy tokens with the KV cache, median of {results['repeat']} runs:"
        ),
        "",
        "| weights | bytes | vs float32 | val loss | Δ val loss | bits/char | tokens/s (decode kernel) | tokens/s (modules) | greedy text = float32's for |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        label = name if name != "int4" else f"int4 (groups of {results['group_size']})"
        gen = generation[f"{name}, modules"]
        kernel = generation[f"{name}, decode kernel"]
        delta = row["val_loss"] - rows["float32"]["val_loss"]
        first = kernel["first_token_differing_from_float32"]
        same = f"all {results['new_tokens']} tokens" if first is None else f"{first} tokens"
        lines.append(
            f"| {label} | {row['weight_bytes']['total']:,} | {row['weight_bytes']['total'] / float_bytes:.3f} | {row['val_loss']:.4f} | "
            f"{delta:+.5f} | {row['bits_per_character']:.4f} | {kernel['tokens_per_s']:,.0f} | {gen['tokens_per_s']:,.0f} | {same} |"
        )
    lines += [
        "",
        "| weights | codes (bytes) | scales (bytes) | float (bytes) | total (bytes) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        wb = row["weight_bytes"]
        lines.append(f"| {name} | {wb['codes']:,} | {wb['scales']:,} | {wb['float']:,} | {wb['total']:,} |")
    if results.get("sizes"):
        lines += [
            "",
            "Generation speed through the decode kernel, random weights, 255 greedy tokens from one (medians, in turns):",
            "",
            "| model | weights | MB | tokens/s | vs float32 |",
            "|---|---|---:|---:|---:|",
        ]
        for size, speeds in results["sizes"].items():
            for name, speed in speeds.items():
                lines.append(f"| {size} | {name} | {speed['weight_mb']:.2f} | {speed['tokens_per_s']:,.0f} | {speed['vs_float32']:.2f}× |")
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)


def markdown_before_kernel_codes(data):
    """The tables of a run made when quantized models generated through the modules only."""
    results = data["quantize"]
    rows, generation = results["models"], results["generation"]
    float_bytes = rows["float32"]["weight_bytes"]["total"]
    lines = [
        (
            f"The default recipe after {results['iters']} training steps: val loss over {rows['float32']['val_tokens']:,} validation tokens; "
            f"{results['new_tokens']} greedy tokens with the KV cache, median of {results['repeat']} runs:"
        ),
        "",
        "| weights | bytes | vs float32 | val loss | Δ val loss | bits/char | tokens/s (modules) | greedy text = float32's for |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        label = name if name != "int4" else f"int4 (groups of {results['group_size']})"
        gen = generation[f"{name}, modules"]
        delta = row["val_loss"] - rows["float32"]["val_loss"]
        first = gen["first_token_differing_from_float32"]
        same = f"all {results['new_tokens']} tokens" if first is None else f"{first} tokens"
        lines.append(
            f"| {label} | {row['weight_bytes']['total']:,} | {row['weight_bytes']['total'] / float_bytes:.3f} | {row['val_loss']:.4f} | "
            f"{delta:+.5f} | {row['bits_per_character']:.4f} | {gen['tokens_per_s']:,.0f} | {same} |"
        )
    decode = generation["float32, decode kernel"]
    lines += [
        "",
        f"float32 through the fast set's decode kernel: {decode['tokens_per_s']:,.0f} tokens/s.",
        "",
        "| weights | codes (bytes) | scales (bytes) | float (bytes) | total (bytes) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        wb = row["weight_bytes"]
        lines.append(f"| {name} | {wb['codes']:,} | {wb['scales']:,} | {wb['float']:,} | {wb['total']:,} |")
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)
