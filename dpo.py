"""Fine-tune a trained GPT on preference pairs with direct preference optimization (DPO).

    python dpo.py --init-from out                                 # the built-in task, every weight
    python dpo.py --init-from out --beta 0.5 --lora-rank 8        # LoRA adapters; the base is the reference
    python dpo.py --init-from out --pairs pairs.jsonl             # {"prompt", "chosen", "rejected"} per line
    python dpo.py --out-dir out-dpo --resume --max-iters 400      # continue
    python generate.py --out-dir out-dpo                          # sample the fine-tuned model

The loss (microtensor/ops/electives/dpo_loss.py, docs/electives/dpo.md), with m the margin of the
chosen continuation's log-ratio log π/π_ref over the rejected one's:

    L = -log σ(β m)

The policy π starts as the checkpoint in --init-from; the reference π_ref is a frozen copy of it
(or of --reference), or with --lora-rank the base itself with the adapters switched off. The pairs
come from --pairs FILE, or from the built-in task (--pairs builtin): prompt a line of --data,
chosen the next line, rejected that next line with its words shuffled (gpt/text/electives/
preferences.py says why), held out from the text's last 10%.

A program of its own rather than flags of train.py: its data are pairs, not a stream of tokens;
each step runs two models and measures preference accuracy, reward margins and a KL, not a loss
per token; and none of train.py's batching, schedule or model flags apply. It reads like train.py,
top to bottom: the flags, then main() -> fine_tune(): set-up, the loop, the results; and shares its
pieces: flag errors, signals and exit codes (programs/cli.py), LoRA's set-up and the fine-tuning
records (programs/training.py), checkpoints (gpt/checkpoints/checkpoint.py). The checkpoint it
writes is a fine-tuning's like train.py's (a full model naming its base, or adapters naming it),
so generate.py samples it, and --resume continues it exactly (model, AdamW's moments, the step,
the generator that draws the pairs).
"""
import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from rich.markup import escape
from rich.table import Table

import microtensor as mt
from microtensor import MicrotensorError, optim
from gpt.checkpoints import checkpoint
from gpt.model.electives import dpo, lora
from gpt.text import data
from gpt.text.electives import preferences
from programs import cli, training
from programs.cli import FlagError, TrainingStopped, console


def build_parser():
    p = argparse.ArgumentParser(
        description="Fine-tune a trained GPT on preference pairs with DPO (docs/electives/dpo.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run = p.add_argument_group("models and output")
    run.add_argument("--init-from", metavar="DIR", default=None, help="the checkpoint train.py wrote in DIR: the policy starts from it, and a frozen copy is the reference")
    run.add_argument("--reference", metavar="DIR", default=None, help="another checkpoint as the frozen reference (default: --init-from's, or with --lora-rank the base itself); it must have the same vocabulary")
    run.add_argument("--out-dir", default="out-dpo", help="folder for the fine-tuned checkpoint (ckpt.npz)")
    run.add_argument("--resume", action="store_true", help="continue the fine-tuning in --out-dir (its model, optimizer, step, pairs and settings); only --max-iters and --eval-interval may change")
    run.add_argument("--force", action="store_true", help="start a new run even though --out-dir holds a checkpoint")
    run.add_argument("--seed", type=int, default=1337, help="seed for the order of the pairs, the built-in task's shuffles and LoRA's initial weights")
    cli.add_kernels_argument(p, run)
    pairs = p.add_argument_group("preference pairs")
    pairs.add_argument("--pairs", default="builtin", help="a JSONL file of {\"prompt\", \"chosen\", \"rejected\"} per line (10%% held out), or 'builtin': the task made from --data")
    pairs.add_argument("--data", default="shakespeare", help="the text of the built-in task: a UTF-8 file, or 'shakespeare'")
    pairs.add_argument("--train-pairs", type=int, default=2000, help="with --pairs builtin: at most this many training pairs (the first in the text)")
    pairs.add_argument("--eval-pairs", type=int, default=128, help="held-out pairs the measures are taken on")
    tune = p.add_argument_group("optimization")
    tune.add_argument("--beta", type=float, default=0.1, help="DPO's β: the implicit reward is β log(π/π_ref); a larger β keeps the policy nearer the reference")
    tune.add_argument("--max-iters", type=int, default=200, help="total steps")
    tune.add_argument("--batch-size", type=int, default=8, help="pairs per step")
    tune.add_argument("--learning-rate", type=float, default=3e-4, help="AdamW's learning rate (constant)")
    tune.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's decoupled weight decay (matrices only)")
    tune.add_argument("--grad-clip", type=float, default=1.0, help="clip the global gradient norm to this (0: off)")
    tune.add_argument("--eval-interval", type=int, default=50, help="measure the held-out pairs and save a checkpoint every this many steps")
    tune.add_argument("--lora-rank", type=int, default=None, help="freeze the base and train LoRA adapters of this rank (docs/electives/lora.md); the reference is then the base itself")
    tune.add_argument("--lora-alpha", type=float, default=None, help="LoRA's alpha (default: the rank)")
    tune.add_argument("--lora-targets", default=",".join(lora.DEFAULT_TARGETS), help="the Linear layers to adapt, comma-separated")
    return p


# The settings a resumed run keeps from its checkpoint (the others may be given again).
KEPT_ON_RESUME = (
    "init_from", "reference", "pairs", "data", "train_pairs", "eval_pairs", "beta", "batch_size", "learning_rate",
    "weight_decay", "grad_clip", "lora_rank", "lora_alpha", "lora_targets", "seed",
)  # fmt: skip


def main(argv=None):
    """The program: returns its exit code (0; 1 for an error; 130 or 143 after Ctrl-C or SIGTERM)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    explicit = cli.explicit_flags(parser, argv)
    try:
        fine_tune(args, explicit)
    except (MicrotensorError, MemoryError, KeyboardInterrupt) as error:
        return cli.exit_code(error, interrupted="{signal} before fine-tuning started; nothing was saved")
    return 0


def check_args(args, explicit=()):
    """Every flag before anything is read; the first that cannot work is a FlagError naming it."""

    need = cli.flag_check(args)
    if args.resume:
        cli.refuse_settings_on_resume(args, explicit, KEPT_ON_RESUME)
        return
    need(args.init_from is not None, "init_from", "a folder holding a checkpoint train.py wrote: --init-from DIR")
    need(math.isfinite(args.beta) and args.beta > 0, "beta", "a finite number > 0 (β <= 0 would reward moving away from the preferred answers, or nothing)")
    for name in ("batch_size", "eval_pairs", "eval_interval", "train_pairs"):
        need(getattr(args, name) >= 1, name, "an integer >= 1")
    need(args.max_iters >= 0, "max_iters", "an integer >= 0")
    need(math.isfinite(args.learning_rate) and args.learning_rate > 0, "learning_rate", "a finite number > 0")
    for name in ("weight_decay", "grad_clip"):
        need(math.isfinite(getattr(args, name)) and getattr(args, name) >= 0, name, "a finite number >= 0")
    if args.lora_rank is not None:
        need(args.lora_rank >= 1, "lora_rank", "an integer >= 1")
    elif "lora_alpha" in explicit or "lora_targets" in explicit:
        name = "lora_alpha" if "lora_alpha" in explicit else "lora_targets"
        raise FlagError(name, f"{getattr(args, name)} without --lora-rank", "--lora-rank R as well: alone it changes nothing")
    if args.lora_alpha is not None:
        need(math.isfinite(args.lora_alpha) and args.lora_alpha > 0, "lora_alpha", "a finite number > 0")
    if Path(args.init_from).resolve() == Path(args.out_dir).resolve():
        raise FlagError("out_dir", args.out_dir, "a folder other than --init-from's: the fine-tuned checkpoint would replace its start")
    if args.pairs == "builtin":
        data.check_data_path(args.data)
    elif not Path(args.pairs).is_file():
        raise FlagError("pairs", args.pairs, "a JSONL file of preference pairs, or 'builtin'")


def load_reference(folder, config, tokenizer):
    """The frozen model of --reference, refused unless its vocabulary is the policy's."""
    model, reference_tokenizer, _ = training.load_full_model("reference", folder)
    ours, theirs = checkpoint.tokenizer_meta(tokenizer), checkpoint.tokenizer_meta(reference_tokenizer)
    if model.config.vocab_size != config.vocab_size or ours != theirs:
        raise FlagError(
            "reference", folder,
            f"a checkpoint of the policy's vocabulary ({config.vocab_size} tokens); this one has "
            f"{model.config.vocab_size} tokens{'' if model.config.vocab_size != config.vocab_size else ', not the same ones'}: "
            "log-probabilities of two vocabularies cannot be compared",
        )  # fmt: skip
    return dpo.frozen_copy(model)


def read_pairs(args, tokenizer):
    """(train pairs, held-out pairs), every character checked against the checkpoint's vocabulary."""
    if args.pairs == "builtin":
        text = data.load_text(args.data, console)
        train_pairs, held_out = preferences.corpus_pairs(text, seed=args.seed, max_pairs=None)
        train_pairs = train_pairs[: args.train_pairs]
        source = f"the built-in task on --data {args.data}"
    else:
        train_pairs, held_out = preferences.split_pairs(preferences.read_pairs(args.pairs), seed=args.seed)
        source = f"--pairs {args.pairs}"
    held_out = held_out[: args.eval_pairs]
    preferences.check_vocabulary(train_pairs + held_out, tokenizer, source)
    console.print(f"preference pairs from {escape(source)}: {len(train_pairs):,} for training, {len(held_out):,} held out")
    return train_pairs, held_out


def set_up(args, explicit):
    """(policy, reference, optimizer, tokenizer, pairs, records, step, pair generator): a new run from
    --init-from, or the checkpoint of --resume with its settings."""
    path = checkpoint.path_in(args.out_dir)
    meta = None
    if args.resume:
        try:
            model_state, optim_state, meta = checkpoint.load(args.out_dir)
        except checkpoint.CheckpointError as error:
            raise FlagError("resume", f"with --out-dir {args.out_dir}", f"a DPO checkpoint there ({error})") from None
        if "dpo" not in meta:
            raise FlagError("resume", f"with --out-dir {args.out_dir}", f"a checkpoint dpo.py wrote; {path} was not fine-tuned with DPO")
        for name in KEPT_ON_RESUME:
            setattr(args, name, meta["dpo"]["settings"][name])
    else:
        checkpoint.prepare_out_dir(args.out_dir)
        if path.exists() and not args.force:
            raise FlagError("out_dir", args.out_dir, f"a folder without a checkpoint: {path} exists; pass --resume to continue it, --force to replace it")
    policy, tokenizer, _ = training.load_full_model("init_from", args.init_from)
    config = policy.config
    lora_record = base_record = None
    if args.lora_rank is not None:
        alpha = float(args.lora_rank) if args.lora_alpha is None else args.lora_alpha
        lora_record = checkpoint.lora_meta(args.init_from, args.lora_rank, alpha, lora.check_targets(args.lora_targets))
        with lora.generator_left_alone():
            mt.manual_seed(args.seed)
            training.add_adapters(policy, lora_record)
    else:
        base_record = {"base": str(Path(args.init_from).resolve()), "base_sha256": checkpoint.file_sha256(checkpoint.path_in(args.init_from))}
    if args.reference is not None:
        reference = dpo.Reference(load_reference(args.reference, config, tokenizer))
    elif lora_record is not None:
        reference = dpo.Reference(policy, adapters_off=True)  # the frozen base: no copy
    else:
        reference = dpo.Reference(dpo.frozen_copy(policy))
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = optim.AdamW(optim.weight_decay_groups(trainable, args.weight_decay), lr=args.learning_rate)
    pair_rng = np.random.default_rng(args.seed)
    start = 0
    if meta is not None:
        record = meta.get("lora") or meta.get("init_from")
        if record["base_sha256"] != checkpoint.file_sha256(checkpoint.path_in(args.init_from)):
            raise checkpoint.CheckpointError(f"{path}: its start {args.init_from} has changed since the fine-tuning began; its reference is gone")
        if lora_record is not None:
            lora.load_lora_state_dict(policy, model_state)
        else:
            policy.load_state_dict(model_state)
        optimizer.load_state_dict(optim_state)
        pair_rng.bit_generator.state = meta["dpo"]["pair_rng"]
        start = meta["iteration"]
        console.print(f"resuming from {escape(args.out_dir)} at step {start}")
    policy.eval()  # dropout off: at step 0 the policy's log-probabilities are the reference's exactly
    train_pairs, held_out = read_pairs(args, tokenizer)
    return policy, reference, optimizer, trainable, tokenizer, train_pairs, held_out, lora_record, base_record, start, pair_rng, meta


def save(args, step, policy, optimizer, tokenizer, lora_record, base_record, pair_rng, history):
    """The checkpoint of this step: a fine-tuning's, as train.py writes it (generate.py reads it), plus DPO's record."""
    meta = {
        "iteration": step, "config": policy.config.to_dict(), **checkpoint.tokenizer_meta(tokenizer),
        "args": vars(args), "global_rng": mt.random.get_state(),
        "dpo": {"settings": {name: getattr(args, name) for name in KEPT_ON_RESUME}, "pair_rng": pair_rng.bit_generator.state, "history": history},
    }  # fmt: skip
    if lora_record is not None:
        meta["lora"] = lora_record
    else:
        meta["init_from"] = base_record
    parameters = lora.lora_state_dict(policy) if lora_record is not None else None
    try:
        checkpoint.save(args.out_dir, policy, optimizer, meta, parameters=parameters)
    except checkpoint.CheckpointSaveError as error:
        raise TrainingStopped(f"{error}; fine-tuning stopped at step {step}") from None


def fine_tune(args, explicit=None):
    """Run DPO as `args` (from build_parser) says; returns the results dict (the measures before and after)."""
    if explicit is None:
        explicit = cli.flags_unlike_defaults(build_parser(), args)
    check_args(args, explicit)
    run = cli.Run(checkpoint.path_in(args.out_dir))
    with mt.using_kernels(args.kernels), run.handling_signals():
        policy, reference, optimizer, trainable, tokenizer, train_pairs, held_out, lora_record, base_record, start, pair_rng, meta = set_up(args, explicit)
        block = policy.config.block_size

        def encode(pairs):
            return dpo.encode_pairs(pairs, tokenizer, block)

        eval_batches = dpo.batched(encode, held_out, 32)
        history = meta["dpo"]["history"] if meta is not None else [{"step": 0, **dpo.evaluate(policy, reference, eval_batches, args.beta)}]
        show_measures(history[0], "before")
        started = time.perf_counter()
        run.graceful = True
        for step in range(start, args.max_iters):
            if run.stop_signal is not None:
                save(args, step, policy, optimizer, tokenizer, lora_record, base_record, pair_rng, history)
                raise TrainingStopped(f"{cli.signal_name(run.stop_signal)}: interrupted at step {step}; saved to {run.path}; resume with --resume", 128 + run.stop_signal)
            if step % args.eval_interval == 0 and step > start:
                history.append({"step": step, **dpo.evaluate(policy, reference, eval_batches, args.beta)})
                show_measures(history[-1], f"step {step}")
                save(args, step, policy, optimizer, tokenizer, lora_record, base_record, pair_rng, history)
            chosen = pair_rng.choice(len(train_pairs), size=min(args.batch_size, len(train_pairs)), replace=False)
            batch = encode([train_pairs[i] for i in chosen])
            loss, margins, _ = dpo.dpo_batch_loss(policy, reference, batch, args.beta)
            if not math.isfinite(loss.item()):
                raise TrainingStopped(f"the loss became {loss.item()} at step {step}; try a lower --learning-rate")
            loss.backward()
            if args.grad_clip > 0:
                optim.clip_grad_norm(trainable, args.grad_clip)
            optimizer.step()
            optimizer.zero_grad()
            if (step + 1) % 10 == 0 or step == args.max_iters - 1:
                console.print(f"step {step + 1}/{args.max_iters}: loss {loss.item():.4f}, batch accuracy {np.mean(margins > 0):.2f}")
        seconds = time.perf_counter() - started
        if history[-1]["step"] != args.max_iters:
            history.append({"step": args.max_iters, **dpo.evaluate(policy, reference, eval_batches, args.beta)})
        save(args, args.max_iters, policy, optimizer, tokenizer, lora_record, base_record, pair_rng, history)
        run.graceful = False
        results = {"before": history[0], "after": history[-1], "history": history, "seconds": seconds, "beta": args.beta,
                   "trainable_parameters": lora.count_parameters(policy)[0], "parameters": lora.count_parameters(policy)[1]}  # fmt: skip
        show_results(results, args)
        return results


def show_measures(measures, when):
    console.print(
        f"{when}: held-out preference accuracy {measures['accuracy']:.3f} (log π(y⁺) > log π(y⁻): {measures['likelihood_accuracy']:.3f}), reward margin {measures['reward_margin']:+.4f}, "
        f"loss {measures['loss']:.4f}, KL from the reference {measures['kl']:.5f} per token"
    )


def show_results(results, args):
    table = Table(title=f"DPO, β = {args.beta:g} ({escape(str(checkpoint.path_in(args.out_dir)))})")
    table.add_column("held out")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    before, after = results["before"], results["after"]
    table.add_row("preference accuracy", f"{before['accuracy']:.3f}", f"{after['accuracy']:.3f}")
    table.add_row("log π(y⁺|x) > log π(y⁻|x)", f"{before['likelihood_accuracy']:.3f}", f"{after['likelihood_accuracy']:.3f}")
    table.add_row("mean implicit reward margin", f"{before['reward_margin']:+.4f}", f"{after['reward_margin']:+.4f}")
    table.add_row("DPO loss", f"{before['loss']:.4f}", f"{after['loss']:.4f}")
    table.add_row("KL(π ‖ π_ref) per token", f"{before['kl']:.5f}", f"{after['kl']:.5f}")
    console.print(table)
    console.print(f"trained {results['trainable_parameters']:,} of {results['parameters']:,} parameters; sample with: python generate.py --out-dir {escape(args.out_dir)}")


if __name__ == "__main__":
    sys.exit(main())
