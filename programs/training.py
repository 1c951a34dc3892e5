"""The setup of a training run for train.py: the flags' checks, and everything the training loop
starts from (model, optimizer, tokenizer, batches, loss history, random states) for a new run,
--resume, --init-from and LoRA, and the saving of a checkpoint with its plot.

Every flag is checked before any data is read or any model built (`check_args`): the model's flags
by GPTConfig itself (programs/cli.py turns its error into one that names the flag), the others
here, and the memory a training step needs against the memory available (`check_memory`, from
the estimate `training_step_bytes` in gpt/model/transformer.py). A run that starts from a
checkpoint (--resume, --init-from) then refuses every flag that contradicts it, naming both values
(`check_resume`, `check_base_flags`). `set_up` builds the rest. `--data addition` trains on generated sums instead
of a text (gpt/text/electives/addition.py): `addition_task` makes the task, which gives the
tokenizer and the batches, and the run ends with the exact-match accuracy on held-out sums.
"""
import contextlib
import dataclasses
import math
import os
import time
from pathlib import Path

import numpy as np
from rich.markup import escape

import microtensor as mt
from microtensor import InputError, InputTypeError, MicrotensorError, optim
from gpt.text.electives import bpe
from gpt.text.electives.addition import AdditionTask
from gpt.checkpoints import checkpoint
from gpt.text import data
from gpt.model.electives import lora
from gpt.text.data import Batches, CharTokenizer, DataError, check_data_path, load_text, sha256
from gpt.model.transformer import GPT, GPTConfig, parameter_count, training_step_bytes
from programs import loss_plot
from programs.cli import FlagError, TrainingStopped, config_flags, config_from_flags, console, flag, signal_name

# The flags that set the model, made from GPTConfig's fields ({dest: field}): a resumed run must not
# contradict its checkpoint.
MODEL_FLAGS = config_flags(GPTConfig)
# Flags that mean something only beside another: given without it, they would be silently ignored.
# GIVEN: the other flag must be given, whatever its value.
GIVEN = object()
DEPENDENT_FLAGS = {
    **{f.name: f.metadata["only_with"] for f in dataclasses.fields(GPTConfig) if "only_with" in f.metadata},  # --n-expert needs --mlp moe
    "moe_aux_weight": ("mlp", "moe"), "vocab_size": ("tokenizer", "bpe"),
    "lora_rank": ("init_from", GIVEN), "lora_alpha": ("lora_rank", GIVEN), "lora_targets": ("lora_rank", GIVEN),
    "loss_scale_interval": ("dtype", "float16"), "addition_digits": ("data", "addition"),
}  # fmt: skip
# --dtype: the format of activations, gradients and weight copies (docs/electives/mixed-precision.md)
TRAINING_DTYPES = ("float32", "float16", "bfloat16")
# --data addition: the task's name, and the held-out problems train.py answers at the end
ADDITION, ADDITION_EVAL_PROBLEMS = "addition", 500
# AdamW's settings that a checkpoint's optimizer state holds (the learning rate is the schedule's)
OPTIMIZER_FLAGS = ("beta1", "beta2", "weight_decay")


def check_args(args, explicit=()):
    """Every flag, before anything is read or built; raises FlagError for the first that cannot work.
    explicit: the flags given on the command line (cli.explicit_flags), to refuse those that would be ignored."""

    def need(ok, name, expected):
        if not ok:
            raise FlagError(name, getattr(args, name), expected)

    need(
        args.dtype in TRAINING_DTYPES, "dtype",
        "float32, float16 or bfloat16 (16-bit training keeps float32 master weights; 8-bit floats are not supported)",
    )  # fmt: skip
    # A flag given without the one it belongs with is named first: its value then means nothing.
    for name, (other, value) in DEPENDENT_FLAGS.items():
        if value is GIVEN and name in explicit and getattr(args, other) is None:
            other_spelled = flag(other) + (" DIR" if other == "init_from" else " R")
            raise FlagError(name, f"{getattr(args, name)} without {flag(other)}", f"{other_spelled} as well: alone it changes nothing")
        if value is not GIVEN and name in explicit and getattr(args, other) != value:
            raise FlagError(name, f"{getattr(args, name)} without {flag(other)} {value}", f"{flag(other)} {value} as well: alone it changes nothing")
    if args.data == ADDITION:
        check_addition_flags(args, explicit)
    config = config_from_flags(GPTConfig, args, vocab_size=1)  # the model's flags: GPTConfig checks them (the vocabulary comes later)
    for name in ("batch_size", "eval_interval", "eval_iters", "loss_scale_interval"):
        need(getattr(args, name) >= 1, name, "an integer >= 1")
    if not args.resume and args.init_from is None:  # else the model is the checkpoint's: set_up checks it
        # before the text is read: with a vocabulary of 1 (BPE: --vocab-size), a step needs at least this
        vocabulary = args.vocab_size if args.tokenizer == "bpe" else 1
        check_memory(args, dataclasses.replace(config, vocab_size=vocabulary), itemsize=4, trains_every_weight=True, vocabulary_known=False)
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
    if args.data != ADDITION:
        check_data_path(args.data)  # a DataError that names --data


def check_addition_flags(args, explicit):
    """--data addition's flags: --addition-digits, a character tokenizer, and a block that holds a
    whole problem (by default exactly one: a new run's --block-size is set to it)."""
    if not 1 <= args.addition_digits <= 9:
        raise FlagError("addition_digits", args.addition_digits, "an integer in [1, 9]")
    if args.tokenizer != "char":
        raise FlagError("tokenizer", f"{args.tokenizer} with --data addition", "char: the task's alphabet is its 13 characters")
    problem = AdditionTask(args.addition_digits).problem_length  # "dd+dd=" and "ddd\n"
    if "block_size" not in explicit:
        args.block_size = problem - 1  # a row of one problem: its last token is only a target
    elif args.block_size < problem - 1:
        raise FlagError("block_size", args.block_size, f"at least {problem - 1} with --data addition: a problem of {args.addition_digits}-digit operands is {problem} characters")


def addition_task(args, explicit, meta):
    """The AdditionTask of the run (None unless it trains on --data addition, or resumes a
    checkpoint that did): a resumed run keeps its checkpoint's digits and held-out set."""
    recorded = meta.get("addition") if meta is not None else None
    if args.data != ADDITION and not (recorded is not None and "data" not in explicit):
        return None
    if recorded is None:
        return AdditionTask(args.addition_digits)
    if "addition_digits" in explicit and args.addition_digits != recorded["digits"]:
        raise FlagError("addition_digits", f"{args.addition_digits} with --resume", f"the checkpoint's {recorded['digits']}: a resumed run keeps its task; drop the flag")
    args.data, args.addition_digits = ADDITION, recorded["digits"]
    return AdditionTask(recorded["digits"], recorded["seed"])


def set_up(args, explicit, run):
    """Everything the training loop starts from, for a new run, --resume, --init-from, and LoRA.
    args: checked by check_args; explicit: the flags given (cli.explicit_flags); run: a cli.Run.
    Raises FlagError, DataError or CheckpointError."""
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
    # Fine-tuning: the base's weights (None when training from random ones), the record of the
    # base that the checkpoint's meta keeps, and the adapters' settings (None without LoRA).
    base_state, base_record, lora_record = None, None, None
    if args.resume:
        model_state, optim_state, meta = checkpoint.load(args.out_dir)
        config = GPTConfig(**meta["config"])  # checkpoint.load checked it
        start = meta["iteration"]
        check_resume(args, explicit, path, config, optim_state, start)
        check_resume_fine_tuning(args, explicit, path, meta)
        check_resume_dtype(args, explicit, path, meta)
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
    task = addition_task(args, explicit, meta if args.resume else None)
    if task is not None:  # generated problems, no text: the task's description stands for it
        text = task.describe()
        if tokenizer is not None and tokenizer.chars != getattr(task.tokenizer, "chars", None):
            raise DataError(f"--data addition: the checkpoint's vocabulary {getattr(tokenizer, 'chars', type(tokenizer).__name__)!r} is not the task's {task.tokenizer.chars!r}")
    elif args.resume:  # without --data, the text the checkpoint was trained on, not the default corpus
        text, args.data = data.text_to_resume(meta, args.data, "data" in explicit, console, path)
    else:
        text = load_text(args.data, console)
    text_sha256 = sha256(text)
    if args.resume and meta.get("data_sha256") not in (None, text_sha256):
        console.print(f"note: --data {escape(args.data)} is not the text the checkpoint was trained on (their sha256 differ)")
    if tokenizer is None:
        tokenizer = make_tokenizer(args, text) if task is None else task.tokenizer
        config = config_from_flags(GPTConfig, args, vocab_size=tokenizer.vocab_size)  # check_args has checked every value
    # A checkpoint's dtype (float64 after `gpt.checkpoints.convert --dtype float64`) is the model's.
    weights = base_state if base_state is not None else model_state if args.resume else None
    dtype = getattr(mt, str(next(iter(weights.values())).dtype)) if weights is not None else mt.float32
    check_memory(args, config, np.dtype(dtype).itemsize, trains_every_weight=lora_record is None)
    # Memory: the ids take one byte per character (uint8) instead of eight (int64), and the text
    # is let go once encoded.
    try:
        ids = tokenizer.encode(text, dtype=tokenizer.id_dtype) if task is None else None
    except DataError as error:
        whose = "the checkpoint's" if args.resume else f"the base checkpoint's ({checkpoint.path_in(args.init_from)})"
        raise DataError(f"--data {args.data} does not fit {whose} vocabulary: {error}") from None
    del text
    if task is not None:
        if config.block_size < task.problem_length - 1:
            raise FlagError("data", f"addition with a model of block {config.block_size}", f"a block of at least {task.problem_length - 1}, one problem")
        batches = task.batches(config.block_size)
    else:
        batches = Batches(ids, config.block_size)
    # Losses are per token; bits per character compare models whose tokens differ (docs/electives/bpe.md).
    val_chars_per_token = characters_per_token(tokenizer, batches.splits["val"]) if task is None else 1.0
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
        else:  # a checkpoint imported by gpt.checkpoints.convert carries no optimizer state
            console.print("the checkpoint holds no optimizer state: AdamW's moments start at zero")
        batch_rng.bit_generator.state = meta["batch_rng"]
        mt.random.set_state(meta["global_rng"])
        console.print(f"resuming from {escape(args.out_dir)} at step {start}")
    console.print(
        f"[bold]GPT[/] {config.n_layer} layers, {config.n_head} heads, {config.n_embd} wide, block {config.block_size}, "
        f"vocabulary {config.vocab_size}: {model.num_parameters():,} parameters; "
        + (task.describe() if task is not None else f"{len(ids):,} {'characters' if isinstance(tokenizer, CharTokenizer) else 'tokens'} of text")
    )
    trained, total = lora.count_parameters(model)
    fine_tuning = describe_fine_tuning(lora_record, base_record)
    if fine_tuning is not None:
        console.print(f"fine-tuning {escape(fine_tuning)}: {trained:,} of the {total:,} parameters are trained")
    loss_scaler = None  # float16's dynamic loss scaling; bfloat16 has float32's range and needs none
    if args.dtype == "float16":
        loss_scaler = mt.LossScaler(growth_interval=args.loss_scale_interval)
        if args.resume and "loss_scaler" in meta:
            kept = meta["loss_scaler"].get("growth_interval") if isinstance(meta["loss_scaler"], dict) else None
            if "loss_scale_interval" in explicit and kept is not None and args.loss_scale_interval != kept:
                raise FlagError(
                    "loss_scale_interval", f"{args.loss_scale_interval} with --resume",
                    f"the checkpoint's {kept} ({path}): a resumed run keeps its loss scaler; drop the flag",
                )  # fmt: skip
            try:
                loss_scaler.load_state_dict(meta["loss_scaler"])
            except InputError as error:
                raise checkpoint.CheckpointError(f"{path}: its loss scaler's state cannot be restored ({error})") from None
    if args.dtype != "float32":
        console.print(f"{args.dtype} activations, gradients and weight copies; float32 master weights and AdamW state")
    initial = None  # a resumed fine-tuning's losses before it started, measured by the run resumed here
    if fine_tuning is not None and start > 0 and history.evaluations and history.evaluations[0][0] == 0:
        initial = dict(zip(("train", "val"), history.evaluations[0][1:]))
    return TrainingSetup(
        args, run, config, model, optimizer, trainable, tokenizer, batches, batch_rng, history, start, best_val,
        text_sha256, val_chars_per_token, lora_record, base_record, fine_tuning, initial, loss_scaler=loss_scaler, task=task,
    )  # fmt: skip


@dataclasses.dataclass
class TrainingSetup:
    """What the training loop starts from, and the run's records it keeps up to date."""

    args: object  # the flags (an argparse Namespace from train.build_parser)
    run: object  # cli.Run: the checkpoint's path and the step it holds, the signal that asks to stop
    config: GPTConfig
    model: GPT
    optimizer: optim.AdamW
    trainable: list  # the parameters the optimizer trains: all, or with LoRA the adapters alone
    tokenizer: object
    batches: Batches
    batch_rng: np.random.Generator  # draws the training batches: a resumed run continues its sequence
    history: loss_plot.LossHistory  # every step's loss and every evaluation, for loss.svg
    start: int  # the first step to run: 0, or a resumed checkpoint's
    best_val: float | None
    text_sha256: str
    val_chars_per_token: float  # characters per token of the val split: bits per character compare tokenizers
    lora_record: dict | None  # the adapters' settings and their base, with LoRA
    base_record: dict | None  # the base of a full fine-tuning (--init-from without --lora-rank)
    fine_tuning: str | None  # one line on what is fine-tuned (None: nothing is)
    initial: dict | None = None  # the losses on --data before fine-tuning: where it starts from
    loss_scaler: object = None  # mt.LossScaler with --dtype float16, else None
    evaluations: list = dataclasses.field(default_factory=list)  # (step, train loss, val loss) of this run
    task: AdditionTask | None = None  # with --data addition: the problems, their checker and held-out set

    def low_precision(self):
        """The block a step's forward and backward run in: mt.autocast for --dtype float16 or
        bfloat16 (16-bit copies of every weight, float32 masters kept aside), else nothing."""
        return low_precision(self.args, self.model)

    @property
    def plot_path(self):
        return Path(self.args.out_dir) / loss_plot.FILENAME

    def record_evaluation(self, iteration, losses):
        self.best_val = losses["val"] if self.best_val is None else min(self.best_val, losses["val"])
        self.evaluations.append((iteration, losses["train"], losses["val"]))
        self.history.add_evaluation(iteration, losses["train"], losses["val"])

    def save(self, iteration):
        """The checkpoint of this step (atomically: gpt/checkpoints/checkpoint.py), then its loss plot; a save
        that fails stops the run, naming the checkpoint that is kept."""
        args, path = self.args, self.run.path
        meta = {
            "iteration": iteration, "config": self.config.to_dict(), "args": vars(args), **checkpoint.tokenizer_meta(self.tokenizer),
            "best_val": self.best_val, "batch_rng": self.batch_rng.bit_generator.state, "global_rng": mt.random.get_state(),
            "data_path": ADDITION if self.task else data.data_path(args.data), "data_sha256": self.text_sha256, "loss_curve": self.history.to_json(),
        }  # fmt: skip
        if self.task is not None:
            meta["addition"] = {"digits": self.task.digits, "seed": self.task.seed}
        if self.loss_scaler is not None:
            meta["loss_scaler"] = self.loss_scaler.state_dict()
        if self.lora_record is not None:
            meta["lora"] = self.lora_record
        elif self.base_record is not None:
            meta["init_from"] = self.base_record
        try:
            # with LoRA the checkpoint holds the adapters alone: the base is in its own file
            parameters = lora.lora_state_dict(self.model) if self.lora_record is not None else None
            checkpoint.save(args.out_dir, self.model, self.optimizer, meta, parameters=parameters)
        except checkpoint.CheckpointSaveError as error:
            raise TrainingStopped(f"{error}; {self.run.kept()}; training stopped at step {iteration}") from None
        self.run.saved_step = iteration
        write_loss_plot(self.plot_path, self.history, f"training loss of {path}, step {iteration:,}")

    def stop_if_asked(self, iteration):
        """At a step boundary: if Ctrl-C or SIGTERM came, save this step and stop."""
        run = self.run
        if run.stop_signal is None:
            return
        if run.saved_step != iteration:
            self.save(iteration)
        raise TrainingStopped(
            f"{signal_name(run.stop_signal)}: interrupted at step {iteration}; saved to {run.path}; "
            "resume with --resume (and the same flags)", 128 + run.stop_signal,
        )  # fmt: skip


def low_precision(args, model):
    """mt.autocast(--dtype, the model's parameters), or a block that does nothing for float32."""
    if args.dtype == "float32":
        return contextlib.nullcontext()
    return mt.autocast(args.dtype, model.parameters())


def check_resume_dtype(args, explicit, path, meta):
    """A resumed run keeps the checkpoint's --dtype (and its loss scaler): a contradicting flag is
    refused; without the flag, the checkpoint's is taken."""
    kept = meta.get("args", {}).get("dtype", "float32") if isinstance(meta.get("args"), dict) else "float32"
    if "dtype" in explicit and args.dtype != kept:
        raise FlagError("dtype", f"{args.dtype} with --resume", f"the checkpoint's dtype {kept} ({path}): a resumed run keeps it; drop the flag")
    args.dtype = kept


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


class TooLargeForMemory(MicrotensorError):
    """A model whose weights, gradients and optimizer state alone cannot fit in the memory available."""


def available_memory():
    """Bytes of memory this process can get now without swapping: MemAvailable in /proc/meminfo
    (Linux), else the machine's physical memory (os.sysconf), else None: unknown, nothing is refused."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def readable_bytes(n):
    """2.5 * 2**30 -> "2.50 GiB"; in MiB below a GiB, in KiB below a MiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n / 2**10:,.2f} KiB"


def check_memory(args, config, itemsize, trains_every_weight, vocabulary_known=True):
    """Refuse a training step that cannot fit in the memory available, before anything is built: a
    batch too large would otherwise swap for minutes before the first step, or end in a bare
    MemoryError. The need is training_step_bytes (gpt/model/transformer.py), a lower bound. Named:
    the model, when its weights alone do not fit; --block-size, when one sequence does not; else
    --batch-size, with the largest batch that fits. vocabulary_known: False before the text is read
    (config's vocabulary is then the smallest it can be)."""
    available = available_memory()
    if available is None:
        return
    need = training_step_bytes(config, args.batch_size, itemsize, trains_every_weight)
    if need["total"] <= available:
        return
    have = f"the computer has {readable_bytes(available)} of memory available"
    if need["weights"] >= available:
        optimizer = ", their gradients and AdamW's two moments" if trains_every_weight else ""
        raise TooLargeForMemory(
            f"the model (--n-layer {config.n_layer}, --n-embd {config.n_embd}, "
            f"{f'a vocabulary of {config.vocab_size:,}' if vocabulary_known else 'before its vocabulary is counted'}): "
            f"given {parameter_count(config):,} parameters, whose weights{optimizer} need at least "
            f"{readable_bytes(need['weights'])}, expected a model that fits: {have}; train a smaller one"
        )  # fmt: skip
    per_sequence = training_step_bytes(config, 1, itemsize, trains_every_weight)
    if per_sequence["total"] > available:  # one sequence does not fit: the block is too long
        longest = longest_block_that_fits(config, itemsize, trains_every_weight, available)
        raise FlagError(
            "block_size", config.block_size,
            f"at most {longest:,}: one sequence of {config.block_size:,} tokens needs at least "
            f"{readable_bytes(per_sequence['total'])} for a training step (activations kept for backward "
            f"{readable_bytes(per_sequence['activations'])}; weights, gradients, optimizer {readable_bytes(per_sequence['weights'])}), and {have}",
        )  # fmt: skip
    largest = (available - need["weights"]) // per_sequence["activations"]
    raise FlagError(
        "batch_size", args.batch_size,
        f"at most {largest:,}: a step of {args.batch_size:,} sequences of {config.block_size:,} tokens needs at least "
        f"{readable_bytes(need['total'])} (activations kept for backward {readable_bytes(need['activations'])}; weights, gradients, "
        f"optimizer {readable_bytes(need['weights'])}), and {have}",
    )  # fmt: skip


def longest_block_that_fits(config, itemsize, trains_every_weight, available):
    """The largest block_size below config's whose step on one sequence fits in `available` bytes
    (0: none), by bisection: the need grows with the block."""
    def fits(block_size):
        shorter = dataclasses.replace(config, block_size=block_size)
        return training_step_bytes(shorter, 1, itemsize, trains_every_weight)["total"] <= available

    low, high = 0, config.block_size  # fits(low) (or low is 0), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


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


def load_full_model(flag_name, folder):
    """(model, tokenizer, meta) of a full model's checkpoint in `folder` (dpo.py's --init-from and
    --reference, reinforce.py's --init-from), or a FlagError naming the flag."""
    try:
        model, tokenizer, meta = checkpoint.load_model(folder)
    except checkpoint.CheckpointError as error:
        raise FlagError(flag_name, folder, f"a folder holding a checkpoint written by train.py ({error})") from None
    if "lora" in meta:
        raise FlagError(flag_name, folder, f"a full model's checkpoint, but {checkpoint.path_in(folder)} holds LoRA adapters alone")
    return model, tokenizer, meta


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


def earlier_losses(meta, start, path):
    """The LossHistory a checkpoint of step `start` carries in its meta. One without it (written
    before train.py kept the curve, or imported by gpt.checkpoints.convert) or with one that does not fit
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
