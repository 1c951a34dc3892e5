"""The command-line plumbing of train.py and generate.py: their flags' errors, --kernels, the flags
made from a config's fields, Ctrl-C and SIGTERM, and the one line (and exit code) a program ends
with when something goes wrong.

A program never ends in a traceback for a user's mistake or a machine's fault: main() catches the
error and calls `exit_code`, which prints one line and returns 1 for an error, 128 + the signal's
number after Ctrl-C (130) or SIGTERM (143). argparse itself exits with 2 for a flag it cannot parse.
"""
import argparse
import contextlib
import dataclasses
import re
import signal
import threading
import types
import typing

from rich.console import Console
from rich.markup import escape

import microtensor as mt
import microtensor.debug
from microtensor import MicrotensorError
from gpt.model.transformer import ConfigError

console = Console(soft_wrap=True)  # long lines (paths) wrap in the terminal, never with a break inserted


class FlagError(MicrotensorError):
    """A flag whose value cannot work: "--flag: given X, expected Y"."""

    def __init__(self, name, given, expected):
        super().__init__(f"{flag(name)}: given {given}, expected {expected}")


class TrainingStopped(MicrotensorError):
    """The run ends early: a non-finite loss, a failed save, Ctrl-C or SIGTERM. The message says why
    and which checkpoint is kept; exit_code is the program's (1, or 128 + the signal's number)."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


def flag(name):
    """The command-line spelling of an argparse dest: n_layer -> --n-layer."""
    return "--" + name.replace("_", "-")


def exit_code(error, interrupted="{signal}"):
    """What main() does with the error that ends a program: print it in one line and return the exit
    code. interrupted: the line for Ctrl-C or SIGTERM, where {signal} names the signal."""
    if isinstance(error, KeyboardInterrupt):
        signum = getattr(error, "signum", signal.SIGINT)
        say("stopped", interrupted.format(signal=signal_name(signum)))
        return 128 + signum
    if isinstance(error, TrainingStopped):
        say("error" if error.exit_code == 1 else "stopped", str(error))
        return error.exit_code
    if isinstance(error, MemoryError):  # a model or a batch too large for this computer
        say("error", f"out of memory ({error}); try a smaller model or --batch-size")
        return 1
    say("error", str(error))  # FlagError, DataError, CheckpointError, or a model's own check
    return 1


def say(prefix, message):
    console.print(f"[bold red]{prefix}:[/] {escape(message)}", highlight=False)


def flag_check(args):
    """need(ok, name, expected): a FlagError naming --name, the value given and what was expected,
    unless ok. A program's check_args calls it once per rule, in the order the flags are read."""

    def need(ok, name, expected):
        if not ok:
            raise FlagError(name, getattr(args, name), expected)

    return need


def refuse_settings_on_resume(args, explicit, kept):
    """A resumed fine-tuning keeps its checkpoint's settings: a flag of `kept` (names) given again is
    refused, and so is --force beside --resume."""
    given = sorted(name for name in explicit if name in kept)
    if given:
        raise FlagError(given[0], f"{getattr(args, given[0])} with --resume", "no such flag: a resumed fine-tuning keeps its checkpoint's settings; drop it")
    if args.force:
        raise FlagError("force", args.force, "one of --resume and --force")


def explicit_flags(parser, argv):
    """The dests of the flags given on the command line (not left at their defaults): argparse sets a
    default only when the namespace lacks the attribute, so a namespace filled with a marker keeps
    the marker exactly where no flag was given."""
    unset = object()
    dests = vars(parser.parse_args(argv))
    given = parser.parse_args(argv, namespace=argparse.Namespace(**{dest: unset for dest in dests}))
    return {dest for dest, value in vars(given).items() if value is not unset}


def flags_unlike_defaults(parser, args):
    """The dests whose value in `args` differs from the parser's default: the flags a caller that
    built `args` itself, not from a command line, is taken to have given."""
    defaults = vars(parser.parse_args([]))
    return {name for name, value in vars(args).items() if value != defaults.get(name)}


# ------------------------------------------------------------------------------------- --kernels


def add_kernels_argument(parser, group):
    """--kernels. Its default is mt.get_kernels(): MICROTENSOR_KERNELS, else fast."""
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


def add_debugging_flags(parser):
    """--detect-anomaly and --profile N (docs/debugging.md, docs/profiling.md)."""
    group = parser.add_argument_group("debugging")
    group.add_argument(
        "--detect-anomaly", action="store_true",
        help="train inside microtensor.detect_anomaly(): the first op whose forward or backward makes a NaN or an "
        "infinity stops the run, naming the op, the array at fault and the line of the model that called it "
        "(several times slower: for finding where a diverging run goes wrong)",
    )  # fmt: skip
    group.add_argument(
        "--profile", type=int, default=None, metavar="N",
        help="print microtensor.debug.profile's table for step N (counted from 0): time, FLOPs, GFLOP/s, "
        "FLOP/byte and the memory saved for backward per op and phase, and the step's MFU",
    )  # fmt: skip


def check_debugging_flags(args, start):
    """--profile N must name a step the run will take (from `start`, where a resumed run begins)."""
    if args.profile is not None and not start <= args.profile < args.max_iters:
        raise FlagError("profile", args.profile, f"a step this run takes, from {start} to {args.max_iters - 1} (--max-iters {args.max_iters})")


class StepWatch:
    """What --detect-anomaly and --profile put around one training step: `with watch:` around the
    step, `with watch.phase("optimizer"):` around the optimizer (a name in the profile's table)."""

    def __init__(self, args, iteration, console):
        self.watchers = []
        if args.detect_anomaly:
            self.watchers.append(mt.detect_anomaly())
        self.profiler = microtensor.debug.profile(console=console) if args.profile == iteration else None
        if self.profiler is not None:
            self.watchers.append(self.profiler)
        self._stack = None

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        for watcher in self.watchers:
            self._stack.enter_context(watcher)
        return self

    def __exit__(self, *exc_info):
        return self._stack.__exit__(*exc_info)

    def phase(self, name):
        return self.profiler.phase(name) if self.profiler is not None else contextlib.nullcontext()


def runnable_kernel_set(name):
    """A kernel set this process can run ("fast" needs the JIT); an unknown name is left to `choices`."""
    if name in mt.kernels.KERNEL_SETS:
        try:
            with mt.using_kernels(name):
                pass
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return name


# ------------------------------------------------------------------------- flags from a config


def config_flags(config_class):
    """{dest: field} of the flags made from config_class's fields that have a help text: the dest is
    the field's name, or no_<name> for a field that is True by default (the flag turns it off)."""
    return {
        (f"no_{f.name}" if f.default is True else f.name): f.name
        for f in dataclasses.fields(config_class) if "help" in f.metadata
    }  # fmt: skip


def add_config_flags(group, config_class):
    """A flag per field of config_class with a help text, whose type, choices and default are the
    field's: --n-layer (int), --norm {layernorm,rmsnorm}, --bias (off by default), --no-tie-weights
    (on by default). In the help, `name` (another field) is written as its flag."""
    dests = {name: dest for dest, name in config_flags(config_class).items()}
    for f in dataclasses.fields(config_class):
        if f.name not in dests:
            continue
        help = flag_names(f.metadata["help"], config_class)
        if f.type is bool:
            group.add_argument(flag(dests[f.name]), action="store_true", help=help)
            continue
        kind = f.type
        if isinstance(kind, types.UnionType):  # int | None: an int, None by default
            kind = next(t for t in typing.get_args(kind) if t is not type(None))
        choices = f.metadata.get("choices")
        group.add_argument(flag(f.name), type=None if choices else kind, choices=choices, default=f.default, help=help)


def config_from_flags(config_class, args, **fields):
    """config_class(**fields, and each field's value from its flag); a ConfigError becomes a FlagError
    naming the flag, in words that name flags too."""
    flags = config_flags(config_class)
    options = {name: not getattr(args, dest) if dest.startswith("no_") else getattr(args, dest) for dest, name in flags.items()}
    try:
        return config_class(**fields, **options)
    except ConfigError as error:
        dest = next(dest for dest, name in flags.items() if name == error.field)
        raise FlagError(dest, error.given, flag_names(error.expected, config_class)) from None


def flag_names(text, config_class):
    """text with each `field` of config_class written as its flag: `n_head` -> --n-head."""
    dests = {name: dest for dest, name in config_flags(config_class).items()}
    return re.sub(r"`(\w+)`", lambda match: flag(dests.get(match[1], match[1])), text)


# ------------------------------------------------------------------------- Ctrl-C and SIGTERM


class Run:
    """What is known about a training run's checkpoint, for every way the run can end: which step
    the file holds, and whether Ctrl-C or SIGTERM asked the run to stop."""

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

    @contextlib.contextmanager
    def handling_signals(self):
        """Inside the block, SIGINT and SIGTERM go to on_signal, and one that stops the run at once
        becomes a TrainingStopped that says which checkpoint is kept."""
        with signals_handled_by(self.on_signal):
            try:
                yield
            except KeyboardInterrupt as interrupt:
                signum = getattr(interrupt, "signum", signal.SIGINT)
                raise TrainingStopped(f"{signal_name(signum)}: stopped at once; {self.kept()}", 128 + signum) from None


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
