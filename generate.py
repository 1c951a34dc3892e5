"""Sample text from a GPT trained by train.py, streaming it as it is generated.

    python generate.py                                  # from out/ckpt.npz
    python generate.py --prompt "ROMEO:" --temperature 0.8 --top-k 40 --num-samples 2
    python generate.py --kernels readable               # every token through the modules' readable kernels
    python generate.py --beam 4                         # beam search: the most probable continuation it finds
    python generate.py --draft-dir out-small            # speculative decoding with a small draft model
    python generate.py --self-speculative               # a model trained with --mtp n drafts with its extra heads
    python generate.py --addition-eval 500 --self-consistency 8   # a model of train.py --data addition: accuracy

Three ways to generate: sampling (or greedy, --temperature 0) one token at a time, the default;
beam search (--beam K, docs/electives/beam-search.md), which keeps the K most probable hypotheses and prints
the log-probability of its result beside greedy decoding's; and speculative decoding
(--draft-dir DIR, docs/electives/speculative-decoding.md), where a smaller model trained by train.py on the
same tokenizer proposes --speculate tokens that the model checks in one forward: the text has the
same distribution as sampling from the model alone (the same text at --temperature 0), and the
program prints how many proposals were accepted. A model trained with --mtp n (docs/electives/multi-token-prediction.md)
can be its own draft (--self-speculative): its extra heads propose n - 1 tokens, checked by the same
rule (gpt/generation/electives/self_speculative.py). gpt/generation/electives/beam_search.py and gpt/generation/electives/speculative.py hold them.

A model trained on sums (train.py --data addition) is scored instead of sampled with --addition-eval
N: its answers to N held-out problems, and their exact-match accuracy; greedy by default, or with
test-time compute (docs/electives/test-time-compute.md, gpt/generation/electives/test_time.py):
--self-consistency M (the majority of M sampled answers) or --best-of N --scorer logprob|verifier.

As train.py, it ends in one line saying what is wrong, never in a traceback: flags are checked
first, then the checkpoint (gpt/checkpoints/checkpoint.py refuses a truncated or corrupted file by name),
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
from rich.markup import escape

import microtensor as mt
import microtensor.fast.process
from microtensor import InputError, MicrotensorError
from gpt.checkpoints import checkpoint
from gpt.generation.electives.beam_search import beam_search
from gpt.text.electives.bpe import BytePairTokenizer
from gpt.text.data import CharTokenizer, DataError
from gpt.model.electives.quantize import quantize_model, weight_bytes
from gpt.generation.sampling import log_softmax
from gpt.generation.electives.speculative import SpeculativeStats, speculative_tokens
from gpt.generation.electives.self_speculative import self_speculative_tokens
from gpt.generation.electives import test_time
from gpt.text.electives.addition import AdditionTask, greedy_answers
from programs import cli
from programs.cli import FlagError, Interrupted, console, signals_handled_by

DEFAULT_SPECULATE = 4  # the draft's proposals per round
DEFAULT_SEED = 1338  # not train.py's default --seed (1337), which its closing sample draws with: sample 1 here is another text


def build_parser():
    p = argparse.ArgumentParser(description="Sample from a character-level GPT trained by train.py.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out-dir", default="out", help="folder holding the checkpoint written by train.py")
    p.add_argument("--prompt", default="\n", help="text to continue (its characters must be in the training vocabulary)")
    p.add_argument("--max-new-tokens", type=int, default=500, help="characters to generate per sample")
    p.add_argument("--temperature", type=float, default=0.8, help="divide the logits by this; 0 picks the most likely character")
    p.add_argument("--top-k", type=int, default=None, help="sample only among the k most likely characters")
    p.add_argument("--top-p", type=float, default=None, help="sample only among the most likely characters whose probabilities add up to p")
    p.add_argument("--num-samples", type=int, default=1, help="how many samples")
    p.add_argument(
        "--seed", type=int, default=DEFAULT_SEED,
        help="random seed for sampling: sample i draws with seed + i - 1. Not train.py's default --seed (1337), which "
        "its closing sample draws with: so sample 1 is a new text, not the one train.py printed (--seed 1337 with "
        "--max-new-tokens as its --sample-chars prints that one again)",
    )  # fmt: skip
    p.add_argument("--no-kv-cache", action="store_true", help="recompute the whole context for every token (slower; same result)")
    cli.add_kernels_argument(p, p)
    beam = p.add_argument_group("beam search (docs/electives/beam-search.md)")
    beam.add_argument("--beam", type=int, default=None, metavar="K", help="beam search with K beams instead of sampling (1 is greedy); deterministic, so it takes no --temperature > 0, --top-k or --top-p")
    beam.add_argument("--length-penalty", type=float, default=0.0, metavar="ALPHA", help="with --beam and --stop: rank hypotheses by log-probability / length^ALPHA (0: by log-probability)")
    beam.add_argument("--stop", default=None, metavar="TEXT", help="with --beam: a hypothesis ends when it generates this text (one token of the tokenizer, e.g. a newline)")
    p.add_argument("--merge-lora", action="store_true", help="for a LoRA fine-tuning's checkpoint: fold the adapters into the base's weights first (same logits, and the one-token kernel can run)")
    p.add_argument("--quantize", choices=("int8", "int4"), default=None, help="store every weight matrix in 8 bits (per output channel) or 4 bits (groups of 32) and compute from the codes (docs/electives/quantization.md)")
    spec = p.add_argument_group("speculative decoding (docs/electives/speculative-decoding.md)")
    spec.add_argument("--draft-dir", default=None, metavar="DIR", help="folder of a smaller model's checkpoint, trained by train.py with the same tokenizer, that proposes tokens for this one to check")
    spec.add_argument("--speculate", type=int, default=DEFAULT_SPECULATE, metavar="K", help="tokens the draft proposes per round, with --draft-dir")
    spec.add_argument(
        "--self-speculative", action="store_true",
        help="a model trained with --mtp n drafts n - 1 tokens with its extra heads and checks them in one forward: the "
        "same distribution as sampling (the same text at --temperature 0); docs/electives/multi-token-prediction.md",
    )  # fmt: skip
    ttc = p.add_argument_group("test-time compute, for a model of train.py --data addition (docs/electives/test-time-compute.md)")
    ttc.add_argument("--addition-eval", type=int, default=None, metavar="N", help="answer N held-out sums (greedy unless one of the two below) and print the exact-match accuracy")
    ttc.add_argument("--self-consistency", type=int, default=None, metavar="M", help="with --addition-eval: sample M answers at --temperature and keep the most common")
    ttc.add_argument("--best-of", type=int, default=None, metavar="N", help="with --addition-eval: sample N answers at --temperature and keep the one --scorer rates highest")
    ttc.add_argument("--scorer", choices=test_time.SCORERS, default=None, help="with --best-of: the model's log-probability of the answer, or a verifier that checks the digits")
    return p


def check_args(args, explicit=()):
    """Every flag, before the checkpoint is read; raises FlagError for the first that cannot work.
    explicit: the flags given on the command line (cli.explicit_flags), to refuse a --temperature
    or --num-samples that beam search would ignore."""

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
    check_beam_args(args, explicit)
    check_speculative_args(args, explicit)
    check_test_time_args(args)
    if args.self_speculative:
        for name, given in (("beam", args.beam is not None), ("draft_dir", args.draft_dir is not None), ("no_kv_cache", args.no_kv_cache)):
            if given:
                raise FlagError(
                    "self_speculative", f"with {cli.flag(name)}",
                    "no " + cli.flag(name) + ": self-speculative decoding drafts with the model's own heads and verifies over its KV cache",
                )  # fmt: skip


def check_beam_args(args, explicit):
    """--beam K >= 1, and none of the flags it cannot honour: beam search is deterministic (it
    keeps the K most probable hypotheses and draws nothing), so sampling's flags would be ignored."""
    if args.beam is None:
        for name, given in (("stop", args.stop), ("length_penalty", args.length_penalty or None)):
            if given is not None:
                raise FlagError(name, f"{given!r} without --beam", "--beam K as well: it is an option of beam search")
        return
    if args.beam < 1:
        raise FlagError("beam", args.beam, "an integer >= 1 (the beams kept; 1 is greedy search)")
    deterministic = "beam search is deterministic: it keeps the most probable hypotheses and samples nothing"
    for name in ("top_k", "top_p"):
        if getattr(args, name) is not None:
            raise FlagError(name, f"{getattr(args, name)} with --beam {args.beam}", f"no --{name.replace('_', '-')}: {deterministic}")
    if "temperature" in explicit and args.temperature != 0:
        raise FlagError("temperature", f"{args.temperature} with --beam {args.beam}", f"0 or no --temperature: {deterministic}")
    if "num_samples" in explicit and args.num_samples != 1:
        raise FlagError("num_samples", f"{args.num_samples} with --beam {args.beam}", f"1: {deterministic}, so every sample would be the same")
    for name, given in (("draft_dir", args.draft_dir is not None), ("speculate", speculate_given(args, explicit))):
        if given:
            raise FlagError(
                name, f"{getattr(args, name)!r} with --beam {args.beam}",
                "one of --beam and --draft-dir: beam search and speculative decoding are two different ways to generate",
            )  # fmt: skip
    if not (math.isfinite(args.length_penalty) and args.length_penalty >= 0):
        raise FlagError("length_penalty", args.length_penalty, "a finite number >= 0")
    if args.length_penalty != 0 and args.stop is None:
        raise FlagError(
            "length_penalty", f"{args.length_penalty} without --stop",
            "--stop TEXT as well: without an end token every hypothesis has --max-new-tokens tokens, and the "
            "penalty, which divides by the length, cannot change which is best",
        )  # fmt: skip
    if args.stop == "":
        raise FlagError("stop", "''", "the text of one token (e.g. a newline)")


def check_test_time_args(args):
    """--addition-eval N >= 1; --self-consistency M >= 1 or --best-of N >= 1 with --scorer, only with it."""
    if args.addition_eval is None:
        for name in ("self_consistency", "best_of", "scorer"):
            if getattr(args, name) is not None:
                raise FlagError(name, f"{getattr(args, name)} without --addition-eval", "--addition-eval N as well: it answers N held-out sums")
        return
    if args.addition_eval < 1:
        raise FlagError("addition_eval", args.addition_eval, "an integer >= 1 (held-out sums to answer)")
    for name, what in (("self_consistency", "answers to vote among"), ("best_of", "answers to choose from")):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise FlagError(name, getattr(args, name), f"an integer >= 1 ({what})")
    if args.self_consistency is not None and args.best_of is not None:
        raise FlagError("best_of", f"{args.best_of} with --self-consistency", "one of --self-consistency and --best-of")
    if (args.best_of is None) != (args.scorer is None):
        alone = f"{args.scorer} without --best-of" if args.best_of is None else f"{args.best_of} without --scorer"
        raise FlagError("scorer" if args.best_of is None else "best_of", alone, "--best-of N and --scorer logprob|verifier together")
    others = {"beam": args.beam, "draft_dir": args.draft_dir, "self_speculative": args.self_speculative or None, "top_p": args.top_p}
    for name, value in others.items():
        if value is not None:
            raise FlagError(name, f"{value} with --addition-eval", "no " + cli.flag(name) + ": --addition-eval samples its answers itself")


def speculate_given(args, explicit):
    """Whether --speculate was given (on the command line, or, without `explicit`, a value other than its default)."""
    return "speculate" in explicit or args.speculate != DEFAULT_SPECULATE


def check_speculative_args(args, explicit):
    """--speculate K >= 1, and only with --draft-dir (the model that proposes the tokens)."""
    if args.speculate < 1:
        raise FlagError("speculate", args.speculate, "an integer >= 1 (the tokens the draft proposes per round)")
    if speculate_given(args, explicit) and args.draft_dir is None:
        raise FlagError("speculate", f"{args.speculate} without --draft-dir", "--draft-dir DIR as well: the draft model proposes the tokens")
    if args.draft_dir == "":
        raise FlagError("draft_dir", "''", "the folder of the draft model's checkpoint")


def main(argv=None):
    """The program: returns its exit code (0; 1 for an error; 130 or 143 after Ctrl-C or SIGTERM;
    argparse exits with 2 for a flag it cannot parse)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    explicit = cli.explicit_flags(parser, argv)

    def stop_at_once(signum, frame):
        raise Interrupted(signum)

    try:
        with signals_handled_by(stop_at_once):
            check_args(args, explicit)
            microtensor.fast.process.tune_for_training()
            with mt.using_kernels(args.kernels):
                return generate_samples(args)
    except (MicrotensorError, KeyboardInterrupt) as error:  # FlagError, CheckpointError, DataError, a model's own check
        return cli.exit_code(error)
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


def load_model(out_dir, merge_lora=False, quantize=None):
    """(model, tokenizer) of the checkpoint in out_dir: a model trained by train.py, or a base with
    the LoRA adapters of a fine-tuning (merged into its weights with merge_lora, or to quantize them,
    since a quantized layer holds one weight); CheckpointError names the file and what is wrong."""
    model, tokenizer, meta = checkpoint.load_model(out_dir, merge=merge_lora or quantize is not None)
    if merge_lora and "lora" not in meta:
        raise FlagError("merge_lora", f"with {checkpoint.path_in(out_dir)}", "a LoRA fine-tuning's checkpoint (train.py --lora-rank): this one has no adapters to merge")
    if quantize is not None and "lora" in meta and not merge_lora:
        console.print(f"[dim]LoRA adapters merged into the base's weights before quantizing to {quantize}[/]")
    return model, tokenizer


def encode(tokenizer, text, name):
    """The ids of the text of flag `name`, or a FlagError saying what the tokenizer cannot encode."""
    try:
        return tokenizer.encode(text)
    except (DataError, InputError) as error:  # a character outside the vocabulary; BPE: a lone surrogate
        expected = "characters of the model's vocabulary" if isinstance(tokenizer, CharTokenizer) else "text the model's tokenizer can encode"
        raise FlagError(name, repr(text), f"{expected} ({error})") from None


def generate_samples(args):
    model, tokenizer = load_model(args.out_dir, args.merge_lora, args.quantize)
    if args.quantize is not None:
        float_bytes = weight_bytes(model)["total"]
        quantize_model(model, bits=8 if args.quantize == "int8" else 4)
        console.print(f"[dim]weights quantized to {args.quantize}: {weight_bytes(model)['total']:,} bytes, from {float_bytes:,}[/]")
    if args.addition_eval is not None:
        return addition_eval(args, model)
    prompt = encode(tokenizer, args.prompt, "prompt")
    if args.beam is not None:
        return beam_search_sample(args, model, tokenizer, prompt)
    draft = load_draft(args.draft_dir, tokenizer) if args.draft_dir is not None else None
    if args.self_speculative and model.config.mtp < 2:
        raise FlagError(
            "self_speculative", f"with the model of {args.out_dir} (mtp {model.config.mtp})",
            "a model trained with --mtp 2 or more: its extra heads are the draft",
        )  # fmt: skip
    stats = SpeculativeStats()  # also self-speculative decoding's: its drafts come from the extra heads
    generated, seconds = 0, 0.0
    for sample in range(args.num_samples):
        console.rule(f"sample {sample + 1}")
        sys.stdout.write(args.prompt)
        start = time.perf_counter()
        if args.self_speculative:
            tokens = self_speculative_tokens(
                model, prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                seed=args.seed + sample, stats=stats,
            )  # fmt: skip
        elif draft is None:
            steps = model.generate_tokens(
                np.array([prompt]), args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                use_kv_cache=not args.no_kv_cache, seed=args.seed + sample,
            )  # fmt: skip
            tokens = (int(token[0]) for token, _ in steps)
        else:
            tokens = speculative_tokens(
                model, draft, prompt, args.max_new_tokens, args.speculate, temperature=args.temperature,
                top_k=args.top_k, top_p=args.top_p, seed=args.seed + sample, stats=stats, use_kv_cache=not args.no_kv_cache,
            )  # fmt: skip
        generated += write_tokens(tokenizer, tokens)
        seconds += time.perf_counter() - start
        sys.stdout.write("\n")
    mode = "without" if args.no_kv_cache else "with"
    how = f"{mode} the KV cache, {args.kernels} kernels"
    if draft is not None:
        accepted = (
            f"{stats.accepted} of {stats.proposed} accepted, acceptance rate {stats.acceptance_rate:.0%}, "
            f"{stats.tokens_per_round:.2f} tokens per forward of the model"
            if stats.proposed else "nothing proposed"
        )  # fmt: skip
        # The windows cap a round's proposals (gpt/generation/electives/speculative.py, proposals_allowed): say what was proposed.
        per_round = f"{stats.proposed / stats.rounds:.2f} proposals per round (--speculate {args.speculate})" if stats.rounds else f"--speculate {args.speculate}"
        how = f"speculative decoding with the draft {args.draft_dir}, {per_round}: {accepted}; {how}"
    if args.self_speculative:
        accepted = (
            f"{stats.accepted} of {stats.proposed} drafts accepted, acceptance rate {stats.acceptance_rate:.0%}, "
            f"{stats.tokens_per_round:.2f} tokens per forward" if stats.proposed else "nothing drafted"
        )  # fmt: skip
        how = f"self-speculative decoding with {model.config.mtp - 1} extra heads: {accepted}; with the KV cache, through the modules"
    console.print(f"[dim]{generated} tokens in {seconds:.2f} s: {generated / max(seconds, 1e-9):,.0f} tokens/s ({escape(how)})[/]")
    return 0


def addition_eval(args, model):
    """--addition-eval N: the exact-match accuracy of the model's answers to N held-out sums."""
    meta = checkpoint.load(args.out_dir)[2]  # its task: digits and held-out set
    if "addition" not in meta:
        raise FlagError("addition_eval", f"with {checkpoint.path_in(args.out_dir)}", "a checkpoint of train.py --data addition: this one was trained on text")
    task = AdditionTask(meta["addition"]["digits"], meta["addition"]["seed"])
    if args.addition_eval > task.held_out:
        raise FlagError("addition_eval", args.addition_eval, f"at most {task.held_out}, the held-out sums of {task.digits}-digit addition")
    prompts = [p for p, _ in task.problems("val", args.addition_eval, None)]
    start = time.perf_counter()
    if args.self_consistency is not None:
        how = f"self-consistency, the majority of {args.self_consistency} answers at temperature {args.temperature:g}"
        answers = test_time.self_consistency(model, task, prompts, args.self_consistency, args.temperature, args.seed, args.top_k)
    elif args.best_of is not None:
        how = f"best of {args.best_of} answers at temperature {args.temperature:g}, scored by {args.scorer}"
        answers = test_time.best_of_n(model, task, prompts, args.best_of, args.temperature, args.scorer, args.seed, args.top_k)
    else:
        how = "greedy"
        answers = test_time.TestTimeAnswers(greedy_answers(model, task, prompts), [], len(prompts) * task.answer_length)
    for prompt, completion in list(zip(prompts, answers.completions))[:5]:  # a few, to see what it writes
        mark = "right" if task.is_correct(prompt, completion) else f"wrong, expected {task.expected(prompt)}"
        console.print(f"{prompt}{task.read_answer(completion)}  ({mark})", highlight=False)
    console.print(
        f"exact match on {len(prompts)} held-out sums ({how}): [bold]{answers.accuracy(task, prompts):.1%}[/]; "
        f"{answers.tokens_per_prompt:.1f} tokens per sum, {time.perf_counter() - start:.2f} s"
    )
    return 0


def write_tokens(tokenizer, tokens):
    """Write the text of token ids as they come; returns how many were written."""
    # A BPE token may end inside a character: the stream decoder holds such bytes back until the
    # character is whole (a character tokenizer's tokens are whole characters).
    stream = tokenizer.stream_decoder() if hasattr(tokenizer, "stream_decoder") else None
    written = 0
    try:
        for token in tokens:
            sys.stdout.write(stream.decode([token]) if stream else tokenizer.decode([token]))
            sys.stdout.flush()
            written += 1
        if stream:
            sys.stdout.write(stream.flush())
    except BaseException:  # Ctrl-C, a model's error: end the sample's line before the message
        with contextlib.suppress(OSError):
            sys.stdout.write("\n")
        raise
    return written


def load_draft(draft_dir, tokenizer):
    """The draft model of --draft-dir, refused unless it was trained with the same tokenizer: its
    token ids must mean the same text as the target's, or its proposals would be other tokens."""
    try:
        draft, draft_tokenizer = load_model(draft_dir)
    except checkpoint.CheckpointError as error:
        raise checkpoint.CheckpointError(f"--draft-dir: {error}") from None
    difference = tokenizer_difference(tokenizer, draft_tokenizer)
    if difference:
        raise FlagError("draft_dir", repr(str(draft_dir)), f"a draft model trained with the target's tokenizer, but {difference}")
    return draft


def tokenizer_difference(target, draft):
    """How the draft's tokenizer differs from the target's (None: the same ids for the same text):
    a character tokenizer's characters, or a byte-level BPE's merges."""
    def kind(tokenizer):
        return "byte-level BPE" if isinstance(tokenizer, BytePairTokenizer) else "character"

    if kind(target) != kind(draft):
        return f"the draft's tokenizer is {kind(draft)}, the target's {kind(target)}"
    if isinstance(target, BytePairTokenizer):
        if target.to_dict() != draft.to_dict():
            return f"the draft's BPE merges ({draft.vocab_size} tokens) are not the target's ({target.vocab_size} tokens)"
        return None
    if target.chars != draft.chars:
        return f"the draft's vocabulary {draft.chars!r:.80} is not the target's {target.chars!r:.80}"
    return None


def beam_search_sample(args, model, tokenizer, prompt):
    """Beam search's best continuation, its log-probability and greedy decoding's for comparison."""
    stop = None
    if args.stop is not None:
        ids = encode(tokenizer, args.stop, "stop")
        if len(ids) != 1:
            raise FlagError("stop", repr(args.stop), f"the text of one token; the tokenizer makes {len(ids)} tokens of it")
        stop = int(ids[0])
    console.rule(f"beam search, {args.beam} beams")
    start = time.perf_counter()
    result = beam_search(
        model, prompt, args.beam, args.max_new_tokens, length_penalty=args.length_penalty, stop_token=stop,
        use_kv_cache=not args.no_kv_cache,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    sys.stdout.write(args.prompt + tokenizer.decode(result.tokens) + "\n")
    greedy_logprob, greedy_length = greedy_log_probability(model, prompt, args, stop)
    scored = f" (score {result.score:.3f} with length penalty {args.length_penalty})" if args.length_penalty else ""
    console.print(
        f"[dim]beam search: log-probability {result.logprob:.3f} of its {len(result.tokens)} tokens{scored}; "
        f"greedy: {greedy_logprob:.3f} of {greedy_length} tokens; beam - greedy = {result.logprob - greedy_logprob:+.3f} "
        f"({seconds:.2f} s for the beam search, {'without' if args.no_kv_cache else 'with'} the KV cache, {args.kernels} kernels)[/]"
    )
    return 0


def greedy_log_probability(model, prompt, args, stop):
    """(summed log-probability, tokens) of greedy decoding from the prompt, ending at the stop token."""
    total, length = 0.0, 0
    steps = model.generate_tokens(np.array([prompt]), args.max_new_tokens, temperature=0, use_kv_cache=not args.no_kv_cache)
    for token, logits in steps:
        total += float(log_softmax(logits[0])[token[0]])
        length += 1
        if token[0] == stop:
            break
    return total, length


if __name__ == "__main__":
    sys.exit(main())
