"""Sample text from a GPT trained by train.py, streaming it as it is generated.

    python generate.py                                  # from out/ckpt.npz
    python generate.py --prompt "ROMEO:" --temperature 0.8 --top-k 40 --num-samples 2
    python generate.py --kernels readable               # every token through the modules' readable kernels

As train.py, it ends in one line saying what is wrong, never in a traceback: flags are checked
first, then the checkpoint (models/checkpoint.py refuses a truncated or corrupted file by name),
then the prompt against the model's vocabulary. Ctrl-C or SIGTERM stop the sampling at once.
"""
import argparse
import contextlib
import math
import os
import signal
import sys
import time

import numpy as np
from rich.console import Console
from rich.markup import escape

import microtensor as mt
import microtensor.fast.process
from microtensor.errors import MicrotensorError
from models import checkpoint
from models.data import CharTokenizer, DataError
from models.gpt import GPT, GPTConfig
from train import FlagError, Interrupted, add_kernels_argument, signal_name, signals_handled_by

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


def check_args(args):
    """Every flag, before the checkpoint is read; raises FlagError for the first that cannot work."""

    def need(ok, name, expected):
        if not ok:
            given = getattr(args, name)
            raise FlagError(name, repr(given) if isinstance(given, str) else given, expected)

    need(args.max_new_tokens >= 0, "max_new_tokens", "an integer >= 0")
    need(args.num_samples >= 1, "num_samples", "an integer >= 1")
    need(args.seed >= 0, "seed", "an integer >= 0")
    need(math.isfinite(args.temperature) and args.temperature >= 0, "temperature", "a finite number >= 0 (0: always the most likely)")
    need(args.top_k is None or args.top_k >= 1, "top_k", "an integer >= 1")
    need(args.top_p is None or 0 < args.top_p <= 1, "top_p", "a number in (0, 1]")  # nan fails it
    need(args.prompt != "", "prompt", "at least one character")


def main(argv=None):
    """The program: returns its exit code (0; 1 for an error; 130 or 143 after Ctrl-C or SIGTERM;
    argparse exits with 2 for a flag it cannot parse)."""
    args = build_parser().parse_args(argv)

    def stop_at_once(signum, frame):
        raise Interrupted(signum)

    try:
        with signals_handled_by(stop_at_once):
            check_args(args)
            microtensor.fast.process.tune_for_training()
            with mt.using_kernels(args.kernels):
                return generate_samples(args)
    except MicrotensorError as error:  # FlagError, CheckpointError, DataError, a model's own check
        console.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False)
        return 1
    except KeyboardInterrupt as interrupt:
        signum = getattr(interrupt, "signum", signal.SIGINT)
        console.print(f"[bold red]stopped:[/] {signal_name(signum)}", highlight=False)
        return 128 + signum
    except BrokenPipeError:  # the reader went away (generate.py | head): stop quietly, as Unix tools do
        _silence_stdout()
        return 128 + signal.SIGPIPE if hasattr(signal, "SIGPIPE") else 1


def _silence_stdout():
    """Point stdout at /dev/null, so that Python's final flush does not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor (e.g. output captured in-process)
        pass


def generate_samples(args):
    model_state, _, meta = checkpoint.load(args.out_dir)  # CheckpointError: names the file and what is wrong
    tokenizer = CharTokenizer(meta["vocab"])
    try:
        prompt = tokenizer.encode(args.prompt)
    except DataError as error:
        raise FlagError("prompt", repr(args.prompt), f"characters of the model's vocabulary ({error})") from None
    # The checkpoint's dtype (float64 after `models.convert --dtype float64`) is the model's.
    model = GPT(GPTConfig(**meta["config"]), dtype=getattr(mt, str(next(iter(model_state.values())).dtype)))
    model.load_state_dict(model_state)  # checkpoint.load checked every name and shape
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
        except BaseException:  # Ctrl-C, a model's error: end the sample's line before the message
            with contextlib.suppress(OSError):
                sys.stdout.write("\n")
            raise
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
