"""Beam search and speculative decoding (gpt/generation/electives/beam_search.py, gpt/generation/electives/speculative.py) on a trained target and draft.

    python bench/run.py decoding [--iters 500] [--repeat 3] [--retrain]

Trains, with train.py in a subprocess, a target (the default recipe: 4 layers, 4 heads, 128 wide,
block 64) and a small draft (1 layer, 4 heads, 64 wide, the same block and data, so the same
character vocabulary) on ../shared/data/tinyshakespeare.txt, and keeps both in a folder of the
temporary directory: a second run with the same settings reuses them (--retrain trains again).

Beam search: for a few prompts taken from the validation text (its last 10%), the summed
log-probability of 100 new tokens found by K = 1, 2, 4, 8 beams, against greedy decoding's (K = 1
must equal greedy, token for token; that is checked).

Speculative decoding: after each prompt, as many new tokens as fill the target's block (so that
no window moves: a move rebuilds the caches, a cost that is neither side's), at temperature 0 and
0.8, with k = 2, 4, 6 proposals per round: the acceptance rate, the new tokens per target forward, and the tokens/s
against the target alone (GPT.generate_tokens with its KV cache; both under the fast kernel set,
whose steps are the decode kernel). Each time is the median of --repeat runs (default
3), the runs of every variant taken in turn. At temperature 0 the output must equal the target's
greedy output; that is checked. The costs that decide the speed-up are measured too: one token of
the target through the decode kernel, the target's k + 1 tokens in one call of the decode kernel
(how speculative decoding verifies), one token of the draft, and the draft's k greedy proposals in
one call (how it proposes at temperature 0).
"""
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import TINYSHAKESPEARE, conditions_line, median_seconds, trained_checkpoint, trained_model

import microtensor as mt
from gpt.checkpoints import checkpoint
from gpt.generation.electives.beam_search import beam_search
from gpt.generation.decoder import Decoder
from gpt.model.transformer import GPT, GPTConfig
from gpt.generation.sampling import log_softmax
from gpt.generation.electives.speculative import speculative_generate

TARGET_FLAGS = []  # the default recipe
DRAFT_FLAGS = ["--n-layer", "1", "--n-head", "4", "--n-embd", "64"]
BEAM_WIDTHS = (1, 2, 4, 8)
BEAM_TOKENS = 100
SPECULATE = (2, 4, 6)
TEMPERATURES = (0.0, 0.8)
PROMPTS = 6
PROMPT_CHARS = 8


def val_prompts(text, tokenizer):
    """PROMPTS prompts of PROMPT_CHARS characters from the validation text, each starting a line."""
    val = text[int(0.9 * len(text)) :]
    prompts, at = [], 0
    for i in range(PROMPTS):
        at = val.index("\n", (i + 1) * len(val) // (PROMPTS + 1)) + 1
        prompts.append(tokenizer.encode(val[at : at + PROMPT_CHARS]))
    return prompts


def greedy_logprob(model, prompt, n):
    """(tokens, summed log-probability) of greedy decoding."""
    tokens, total = [], 0.0
    for token, logits in model.generate_tokens(np.array([prompt]), n, temperature=0):
        tokens.append(int(token[0]))
        total += float(log_softmax(logits[0])[token[0]])
    return np.array(tokens), total


def measure_beams(target, prompts):
    rows = []
    for K in BEAM_WIDTHS:
        logprobs, greedy_logprobs, seconds = [], [], []
        for prompt in prompts:
            greedy_tokens, greedy_total = greedy_logprob(target, prompt, BEAM_TOKENS)
            start = time.perf_counter()
            result = beam_search(target, prompt, K, BEAM_TOKENS)
            seconds.append(time.perf_counter() - start)
            if K == 1 and result.tokens.tolist() != greedy_tokens.tolist():
                raise SystemExit("beam search with K = 1 is not greedy decoding")
            logprobs.append(result.logprob)
            greedy_logprobs.append(greedy_total)
        rows.append({
            "beam_width": K, "logprobs": logprobs, "greedy_logprobs": greedy_logprobs,
            "mean_logprob": statistics.mean(logprobs), "mean_greedy_logprob": statistics.mean(greedy_logprobs),
            "mean_gain_over_greedy": statistics.mean(np.subtract(logprobs, greedy_logprobs)),
            "prompts_beating_greedy": int(sum(lp > g + 1e-9 for lp, g in zip(logprobs, greedy_logprobs))),
            "median_seconds": statistics.median(seconds),
        })  # fmt: skip
    return rows


def target_alone(target, prompt, n, temperature, seed):
    tokens = target.generate(np.array([prompt]), n, temperature=temperature, seed=seed)
    return tokens.data[0, len(prompt) :]


def measure_speculative(target, draft, prompts, repeat):
    """Every (temperature, k) and the target alone, each run `repeat` times per prompt in turn."""
    n = target.config.block_size - PROMPT_CHARS  # new tokens per prompt: up to a full window
    variants = [(T, None) for T in TEMPERATURES] + [(T, k) for T in TEMPERATURES for k in SPECULATE]
    times = {v: [] for v in variants}
    stats = {v: [] for v in variants}
    for _ in range(repeat):
        for variant in variants:
            T, k = variant
            elapsed = 0.0
            for seed, prompt in enumerate(prompts):
                start = time.perf_counter()
                if k is None:
                    tokens = target_alone(target, prompt, n, T, seed)
                else:
                    tokens, stat = speculative_generate(target, draft, prompt, n, k, temperature=T, seed=seed)
                    stats[variant].append(stat)
                elapsed += time.perf_counter() - start
                if T == 0 and k is not None and tokens.tolist() != target_alone(target, prompt, n, 0.0, seed).tolist():
                    raise SystemExit(f"speculative decoding at temperature 0 with k = {k} differs from greedy decoding")
            times[variant].append(elapsed)
    new_tokens = n * len(prompts)
    rows = []
    for T in TEMPERATURES:
        alone = statistics.median(times[T, None])
        rows.append({"temperature": T, "speculate": None, "median_seconds": alone, "tokens_per_s": new_tokens / alone})
        for k in SPECULATE:
            seconds = statistics.median(times[T, k])
            proposed = sum(s.proposed for s in stats[T, k])
            accepted = sum(s.accepted for s in stats[T, k])
            rounds = sum(s.rounds for s in stats[T, k])
            generated = sum(s.generated for s in stats[T, k])
            rows.append({
                "temperature": T, "speculate": k, "median_seconds": seconds, "tokens_per_s": new_tokens / seconds,
                "speed_up": alone / seconds, "acceptance_rate": accepted / proposed, "tokens_per_target_forward": generated / rounds,
                "equal_to_greedy": T == 0 or None,
            })  # fmt: skip
    return rows


def measure_costs(target, draft, prompt):
    """Seconds of the pieces of one round: a token of the target through the decode kernel (what
    the target alone pays per token), the target's k + 1 tokens over its cache in one call (one
    verification), a token of the draft, and the draft's k greedy tokens in one call."""
    costs = {}
    with mt.no_grad():
        for name, model in (("target", target), ("draft", draft)):
            cache = Decoder(model, 1, len(prompt))
            sequence = np.array([prompt])
            cache.feed(sequence)
            longer = np.concatenate([sequence, [[1]]], axis=1)

            def one_token(cache=cache, longer=longer):
                cache.rollback(longer.shape[1] - 1)
                cache.feed(longer)

            costs[f"{name}_one_token_decode_kernel_s"] = median_seconds(one_token, 50, warmup=1)[0]
        cache = Decoder(target, 1, len(prompt))
        sequence = np.array([prompt])
        cache.feed(sequence)
        for k in SPECULATE:
            longer = np.concatenate([sequence, np.ones((1, k + 1), dtype=np.int64)], axis=1)

            def verify(cache=cache, longer=longer, k=k):
                cache.rollback(longer.shape[1] - k - 1)
                cache.feed(longer)

            costs[f"target_{k + 1}_tokens_one_call_s"] = median_seconds(verify, 50, warmup=1)[0]
        cache = Decoder(draft, 1, len(prompt))
        sequence = np.array([prompt])
        cache.feed(sequence)
        for k in SPECULATE:

            def propose(cache=cache, sequence=sequence, k=k):
                cache.rollback(sequence.shape[1] - 1)
                cache.feed_greedy(sequence, k)

            costs[f"draft_{k}_greedy_tokens_one_call_s"] = median_seconds(propose, 50, warmup=1)[0]
    return costs


def options(p):
    p.add_argument("--data", default=str(TINYSHAKESPEARE), help="text to train both models on")
    p.add_argument("--iters", type=int, default=500, help="training steps of each model")
    p.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "microtensor-bench-decoding"), help="where the trained models are kept")
    p.add_argument("--retrain", action="store_true", help="train both models again even if the cache folder has them")


def measure(args, machine):
    repeat = args.repeat or 3
    target_dir = trained_checkpoint(Path(args.cache_dir) / "target", args.data, args.iters, TARGET_FLAGS, args.retrain)
    draft_dir = trained_checkpoint(Path(args.cache_dir) / "draft", args.data, args.iters, DRAFT_FLAGS, args.retrain)
    target, tokenizer, target_meta = trained_model(target_dir)
    draft, draft_tokenizer, draft_meta = trained_model(draft_dir)
    if tokenizer.chars != draft_tokenizer.chars:
        raise SystemExit("the target and the draft have different vocabularies")
    text = Path(args.data).read_bytes().decode("utf-8")
    prompts = val_prompts(text, tokenizer)
    with mt.using_kernels("fast"):
        beams = measure_beams(target, prompts)
        speculative = measure_speculative(target, draft, prompts, repeat)
        costs = measure_costs(target, draft, prompts[0])
    settings = {
        "data": Path(args.data).name, "iters": args.iters, "target_flags": TARGET_FLAGS, "draft_flags": DRAFT_FLAGS,
        "target_config": target_meta["config"], "draft_config": draft_meta["config"],
        "target_best_val_loss": target_meta.get("best_val"), "draft_best_val_loss": draft_meta.get("best_val"),
        "beam_tokens": BEAM_TOKENS, "speculative_tokens": target.config.block_size - PROMPT_CHARS, "prompts": PROMPTS, "prompt_chars": PROMPT_CHARS,
        "repeat": repeat, "kernels": "fast",
    }  # fmt: skip
    return {"machine": machine, "settings": settings, "beam_search": beams, "speculative": speculative, "costs": costs}


def markdown(data):
    """The three tables of a run's JSON (the dict measure() returns), and the conditions they ran under."""
    settings = data["settings"]
    lines = [
        f"Beam search: summed log-probability of {settings['beam_tokens']} new tokens, mean over {settings['prompts']} validation prompts:",
        "",
        "| beams K | log-probability | greedy | beam − greedy | prompts where beam > greedy | median time (ms) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["beam_search"]:
        lines.append(
            f"| {row['beam_width']} | {row['mean_logprob']:.2f} | {row['mean_greedy_logprob']:.2f} | {row['mean_gain_over_greedy']:+.2f} "
            f"| {row['prompts_beating_greedy']} of {settings['prompts']} | {row['median_seconds'] * 1e3:,.0f} |"
        )
    lines += [
        "",
        f"Speculative decoding: {settings['speculative_tokens']} new tokens after each of {settings['prompts']} prompts; medians of {settings['repeat']} runs:",
        "",
        "| temperature | k | acceptance rate | tokens per target forward | tokens/s | speed-up vs target alone | output = greedy |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in data["speculative"]:
        if row["speculate"] is None:
            lines.append(f"| {row['temperature']} | target alone | | 1 | {row['tokens_per_s']:,.0f} | 1 | |")
        else:
            equal = "yes" if row["equal_to_greedy"] else ""
            lines.append(
                f"| {row['temperature']} | {row['speculate']} | {row['acceptance_rate']:.0%} | {row['tokens_per_target_forward']:.2f} "
                f"| {row['tokens_per_s']:,.0f} | {row['speed_up']:.2f}× | {equal} |"
            )
    lines += ["", "What one round costs (medians):", "", "| piece | time (µs) |", "|---|---:|"]
    for name, seconds in data["costs"].items():
        lines.append(f"| {name.removesuffix('_s').replace('_', ' ')} | {seconds * 1e6:,.0f} |")
    lines += ["", conditions_line(data["machine"], settings.get("load_average_1min_before_after"))]
    return "\n".join(lines)
