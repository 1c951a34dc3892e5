"""Sample text from a GPT trained by train.py, streaming it as it is generated.

    python generate.py                                  # from out/ckpt.npz
    python generate.py --prompt "ROMEO:" --temperature 0.8 --top-k 40 --num-samples 2
    python generate.py --kernels readable               # every token through the modules' readable kernels
"""
import argparse
import sys
import time

import numpy as np
from rich.console import Console

import microtensor as mt
import microtensor.fast.process
from models import checkpoint
from models.data import CharTokenizer, DataError
from models.gpt import GPT, GPTConfig
from train import add_kernels_argument

console = Console()


def build_parser():
    p = argparse.ArgumentParser(description="Sample from a character-level GPT trained by train.py.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out-dir", default="out", help="folder holding the checkpoint written by train.py")
    p.add_argument("--prompt", default="\n", help="text to continue (its characters must be in the training vocabulary)")
    p.add_argument("--max-new-tokens", type=int, default=500, help="characters to generate per sample")
    p.add_argument("--temperature", type=float, default=0.8, help="divide the logits by this; 0 picks the most likely character")
    p.add_argument("--top-k", type=int, default=None, help="sample only among the k most likely characters")
    p.add_argument("--top-p", type=float, default=None, help="sample only among the most likely characters whose probabilities add up to p")
    p.add_argument("--num-samples", type=int, default=1, help="how many samples")
    p.add_argument("--seed", type=int, default=1337, help="random seed for sampling")
    p.add_argument("--no-kv-cache", action="store_true", help="recompute the whole context for every token (slower; same result)")
    add_kernels_argument(p, p)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    microtensor.fast.process.tune_for_training()
    with mt.using_kernels(args.kernels):
        return generate_samples(args)


def generate_samples(args):
    try:
        model_state, _, meta = checkpoint.load(args.out_dir)
        tokenizer = CharTokenizer(meta["vocab"])
        prompt = tokenizer.encode(args.prompt)
        if len(prompt) == 0:
            raise DataError("--prompt is empty; give at least one character")
        if args.max_new_tokens < 0 or args.num_samples < 1:
            raise DataError("--max-new-tokens must be >= 0 and --num-samples >= 1")
    except DataError as error:
        console.print(f"[bold red]error:[/] prompt: {error}" if "vocabulary" in str(error) else f"[bold red]error:[/] {error}", highlight=False)
        return 1
    except checkpoint.CheckpointError as error:
        console.print(f"[bold red]error:[/] {error}", highlight=False)
        return 1
    model = GPT(GPTConfig(**meta["config"]))
    model.load_state_dict(model_state)
    generated, seconds = 0, 0.0
    for sample in range(args.num_samples):
        console.rule(f"sample {sample + 1}")
        sys.stdout.write(args.prompt)
        start = time.perf_counter()
        tokens = model.generate_tokens(
            np.array([prompt]), args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            use_kv_cache=not args.no_kv_cache, seed=args.seed + sample,
        )  # fmt: skip
        try:
            for token, _ in tokens:
                sys.stdout.write(tokenizer.decode(token))
                sys.stdout.flush()
                generated += 1
        except ValueError as error:
            console.print(f"\n[bold red]error:[/] {error}", highlight=False)
            return 1
        seconds += time.perf_counter() - start
        sys.stdout.write("\n")
    mode = "without" if args.no_kv_cache else "with"
    console.print(
        f"[dim]{generated} tokens in {seconds:.2f} s: {generated / max(seconds, 1e-9):,.0f} tokens/s "
        f"({mode} the KV cache, {args.kernels} kernels)[/]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
