"""bench/README.md is generated, and must stay so: each technique's section is its script's
markdown(data) of the JSON it wrote, and the file is exactly what bench/run_all.py's report()
builds from bench/results/.

Each script's markdown is also checked on a small made-up result, whole table lines at a time, so
that a table or a column that goes missing fails here. Nothing is measured: no benchmark runs.
"""
import importlib
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
sys.path.insert(0, str(BENCH))  # run_all.py and the scripts import each other from there
run_all = importlib.import_module("run_all")

SCRIPTS = {name: script for name, script, _, _ in run_all.TECHNIQUES}
MACHINE = {"date": "2031-05-06", "cores": 3, "numpy": "9.8.7", "numba": "6.5.4", "torch": "1.2.3"}
CONDITIONS = "Measured on 2031-05-06: 3 cores, numpy 9.8.7, numba 6.5.4, PyTorch 1.2.3."


def keeping_the_environment(function, *args):
    """function(*args) with os.environ put back afterwards. The scripts are imported when a test
    runs, not when pytest collects this file, and bench/common.py, which they import, sets
    GOMP_SPINCOUNT as train.py does: programs that later tests start must not inherit it."""
    environment = dict(os.environ)
    try:
        return function(*args)
    finally:
        os.environ.clear()
        os.environ.update(environment)


def technique_module(name):
    """The script of technique `name` (run_all.TECHNIQUES)."""
    return keeping_the_environment(run_all.technique_module, SCRIPTS[name])


def markdown_of(name, data):
    """The markdown the technique `name` makes of `data`."""
    return technique_module(name).markdown(data)


def assert_lines(text, expected):
    lines = text.splitlines()
    missing = [line for line in expected if line not in lines]
    assert not missing, "missing lines:\n" + "\n".join(missing) + "\n\nin:\n" + text


def section(report, title):
    """The text of the report's section `## title`, up to the next section."""
    start = report.index(f"## {title}\n")
    end = report.find("\n## ", start)
    return report[start : end if end != -1 else len(report)]


@pytest.fixture(scope="module")
def report():
    return keeping_the_environment(run_all.report, RESULTS)


# --------------------------------------------------------------------------------- the README


@pytest.mark.parametrize(("name", "script", "title"), [t[:3] for t in run_all.TECHNIQUES], ids=list(SCRIPTS))
def test_each_measured_technique_has_its_section_and_a_table(report, name, script, title):
    assert (RESULTS / f"{name}.json").exists(), f"bench/results/{name}.json is missing: the repository keeps every script's latest results"
    text = section(report, title)
    assert f"From `python bench/{script}`" in text
    assert re.search(r"^\|.*\|\n\|(-+:?\|)+$", text, re.MULTILINE), f"no markdown table in the section {title!r}:\n{text}"
    assert "Measured on " in text


def test_the_readme_is_what_run_all_builds_from_the_results(report):
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    assert readme == report, "bench/README.md differs from its generator: run `python bench/run_all.py --report-only`"


def test_the_conditions_line_names_date_cores_versions_and_load():
    assert run_all.conditions_line(MACHINE) == CONDITIONS
    assert run_all.conditions_line(MACHINE, load=[3.1, 4.7]) == CONDITIONS[:-1] + ", load average 3.1 before, 4.7 after."
    without_torch = {**MACHINE, "torch": "(not installed)"}
    assert run_all.conditions_line(without_torch) == "Measured on 2031-05-06: 3 cores, numpy 9.8.7, numba 6.5.4."


# --------------------------------------------------------------------------------- each script's tables


def test_attention_markdown():
    row = {
        "T": 96, "kernels": "fast", "standard_saved_bytes": 3 << 20, "online_saved_bytes": 5 << 10,
        "standard_peak_rss_growth_bytes": None, "online_peak_rss_growth_bytes": 700,
        "standard_forward_backward_s": 0.01234, "online_forward_backward_s": 0.00617, "standard_over_online": 2.0,
        "online_by_tile_size_s": {"32": 0.00711, "64": 0.00822},
    }  # fmt: skip
    data = {"machine": MACHINE, "shape": {"B": 2, "H": 3, "D": 16, "dtype": "float64", "causal": True}, "rows": [row]}
    assert_lines(markdown_of("attention", data), [
        "Causal attention, B = 2, H = 3, D = 16, float64; forward+backward:",
        "| T | kernels | saved: standard | saved: online | peak RSS growth: standard | peak RSS growth: online | ms fwd+bwd: standard | ms fwd+bwd: online | standard / online |",
        "| 96 | fast | 3.0 MiB | 5.0 KiB | - | 700 B | 12.34 | 6.17 | 2.00× |",
        "| T | ms online, tile 32 | ms online, tile 64 |",
        "| 96 | 7.11 | 8.22 |",
        CONDITIONS,
    ])  # fmt: skip


def test_variants_markdown():
    later = {**MACHINE, "date": "2031-06-07"}
    data = {
        "steps": 321, "seconds": 45.0,
        "kv_cache": [{"attention": "multi-query", "n_kv_head": 1, "bytes_per_token": 1536, "parameters": 123456}],
        "positions": [{"pos": "learned", "val_loss_64": 2.3456, "val_loss_128": None}, {"pos": "rope", "val_loss_64": 2.1111, "val_loss_128": 2.2222}],
        "experts": [
            {"mlp": "gelu", "parameters": 234567, "val_loss": 2.0123, "train_seconds": 1234.4},
            {"mlp": "moe", "parameters": 345678, "val_loss": 1.9876, "train_seconds": 99.6, "share_per_expert": [[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]},
        ],
        "tokenizers": [{"tokenizer": "bpe 512", "vocab_size": 512, "steps": 1234, "chars_per_token": 1.876, "val_loss_per_token": 4.5678, "val_bits_per_char": 3.4567}],
        "machines": {"kv_cache": MACHINE, "positions": MACHINE, "experts": MACHINE, "tokenizers": later},
    }  # fmt: skip
    assert_lines(markdown_of("variants", data), [
        "| attention | n_kv_head | KV cache bytes per token (float32) | parameters |",
        "| multi-query | 1 | 1,536 | 123,456 |",
        "| positions (321 steps at context 64) | val loss at 64 | val loss at 128 |",
        "| learned | 2.3456 | no rows past 64 |",
        "| rope | 2.1111 | 2.2222 |",
        "| MLP (321 steps) | parameters | val loss | train time (s) | tokens per expert, per block |",
        "| gelu | 234,567 | 2.0123 | 1,234 | - |",
        "| moe | 345,678 | 1.9876 | 100 | 0.10/0.20/0.30/0.40; 0.40/0.30/0.20/0.10 |",
        "| tokenizer (45 s of training each) | vocabulary | steps | chars per token | val loss per token | val bits per char |",
        "| bpe 512 | 512 | 1,234 | 1.88 | 4.5678 | 3.4567 |",
        f"kv_cache, positions, experts: {CONDITIONS} tokenizers: {CONDITIONS.replace('2031-05-06', '2031-06-07')}",
    ])  # fmt: skip


def test_decode_variants_markdown():
    data = {
        "machine": MACHINE,
        "settings": {"tokens": 150, "repeat": 7},
        "decode_variants": {
            "baseline": {"kernel_tokens_per_s": 3456.4, "fallback_tokens_per_s": 432.1, "kernel_vs_fallback": 7.999},
            "moe": {"kernel_tokens_per_s": 1234.5, "fallback_tokens_per_s": 98.7, "kernel_vs_fallback": 12.51},
        },
    }
    assert_lines(markdown_of("decode_variants", data), [
        "Greedy generation, 150 tokens, batch 1, KV cache, fast set; medians of 7 runs:",
        "| variant | kernel tokens/s | fallback tokens/s | kernel / fallback |",
        "| baseline (learned, n_kv_head 4, gelu) | 3,456 | 432 | 8.0× |",
        "| mlp moe (E 4, k 2) | 1,234 | 99 | 12.5× |",
        CONDITIONS,
    ])  # fmt: skip


def test_tokenizer_markdown():
    row = {"tokenizer": "bpe 4096", "vocab_size": 4096, "train_s": 12.3456, "encode_s": 1.2367, "encode_mb_per_s": 0.9876, "tokens": 7654, "chars_per_token": 3.0646}
    data = {"machine": MACHINE, "tokenizer": {"corpus": "poems.txt", "characters": 23456, "repeat": 4, "rows": [row]}}
    assert_lines(markdown_of("tokenizer", data), [
        "Tokenizers on poems.txt (23,456 characters); times are medians of 4 runs:",
        "| tokenizer | vocab | train (s) | encode (s) | encode (MB/s) | tokens | chars/token |",
        "| bpe 4096 | 4,096 | 12.35 | 1.24 | 0.99 | 7,654 | 3.06 |",
        CONDITIONS,
    ])  # fmt: skip


def test_decoding_markdown():
    data = {
        "machine": MACHINE,
        "settings": {"beam_tokens": 90, "prompts": 5, "speculative_tokens": 44, "repeat": 4, "load_average_1min_before_after": [3.1, 4.7]},
        "beam_search": [
            {"beam_width": 3, "mean_logprob": -101.234, "mean_greedy_logprob": -104.567, "mean_gain_over_greedy": 3.333, "prompts_beating_greedy": 4, "median_seconds": 1.2346},
        ],
        "speculative": [
            {"temperature": 0.5, "speculate": None, "tokens_per_s": 2345.6},
            {"temperature": 0.5, "speculate": 3, "tokens_per_s": 345.6, "speed_up": 0.147, "acceptance_rate": 0.654, "tokens_per_target_forward": 2.789, "equal_to_greedy": None},
            {"temperature": 0.0, "speculate": 5, "tokens_per_s": 456.7, "speed_up": 0.211, "acceptance_rate": 0.812, "tokens_per_target_forward": 4.321, "equal_to_greedy": True},
        ],
        "costs": {"target_one_token_decode_kernel_s": 0.000123, "target_forward_4_tokens_modules_s": 0.0054321},
    }  # fmt: skip
    assert_lines(markdown_of("decoding", data), [
        "Beam search: summed log-probability of 90 new tokens, mean over 5 validation prompts:",
        "| beams K | log-probability | greedy | beam − greedy | prompts where beam > greedy | median time (ms) |",
        "| 3 | -101.23 | -104.57 | +3.33 | 4 of 5 | 1,235 |",
        "Speculative decoding: 44 new tokens after each of 5 prompts; medians of 4 runs:",
        "| temperature | k | acceptance rate | tokens per target forward | tokens/s | speed-up vs target alone | output = greedy |",
        "| 0.5 | target alone | | 1 | 2,346 | 1 | |",
        "| 0.5 | 3 | 65% | 2.79 | 346 | 0.15× |  |",
        "| 0.0 | 5 | 81% | 4.32 | 457 | 0.21× | yes |",
        "| piece | time (µs) |",
        "| target one token decode kernel | 123 |",
        "| target forward 4 tokens modules | 5,432 |",
        CONDITIONS[:-1] + ", load average 3.1 before, 4.7 after.",
    ])  # fmt: skip


def test_quantize_markdown():
    def weights(codes, scales, float_bytes):
        return {"codes": codes, "scales": scales, "float": float_bytes, "total": codes + scales + float_bytes, "float32": 4_000_000}

    def generated(tokens_per_s, first_difference):
        return {"tokens_per_s": tokens_per_s, "first_token_differing_from_float32": first_difference}

    data = {
        "machine": MACHINE,
        "quantize": {
            "iters": 300, "group_size": 16, "new_tokens": 120, "repeat": 2,
            "models": {
                "float32": {"weight_bytes": weights(0, 0, 4_000_000), "val_loss": 2.5, "val_tokens": 54321, "bits_per_character": 3.6067},
                "int8": {"weight_bytes": weights(1_000_000, 90_000, 10_000), "val_loss": 2.5001, "val_tokens": 54321, "bits_per_character": 3.6069},
                "int4": {"weight_bytes": weights(500_000, 90_000, 10_000), "val_loss": 2.52, "val_tokens": 54321, "bits_per_character": 3.6356},
            },
            "generation": {
                "float32, decode kernel": generated(901.2, None), "float32, modules": generated(300.4, None),
                "int8, modules": generated(350.6, 5), "int4, modules": generated(333.3, 17),
            },
        },
    }  # fmt: skip
    assert_lines(markdown_of("quantize", data), [
        "The default recipe after 300 training steps: val loss over 54,321 validation tokens; 120 greedy tokens with the KV cache, median of 2 runs:",
        "| weights | bytes | vs float32 | val loss | Δ val loss | bits/char | tokens/s (modules) | greedy text = float32's for |",
        "| float32 | 4,000,000 | 1.000 | 2.5000 | +0.00000 | 3.6067 | 300 | all 120 tokens |",
        "| int8 | 1,100,000 | 0.275 | 2.5001 | +0.00010 | 3.6069 | 351 | 5 tokens |",
        "| int4 (groups of 16) | 600,000 | 0.150 | 2.5200 | +0.02000 | 3.6356 | 333 | 17 tokens |",
        "float32 through the fast set's decode kernel: 901 tokens/s.",
        "| weights | codes (bytes) | scales (bytes) | float (bytes) | total (bytes) |",
        "| int8 | 1,000,000 | 90,000 | 10,000 | 1,100,000 |",
        "| int4 | 500,000 | 90,000 | 10,000 | 600,000 |",
        CONDITIONS,
    ])  # fmt: skip


def test_lora_markdown():
    def run(method, trainable, total, after, train_time_s, step_median_s, checkpoint_bytes):
        return {
            "method": method, "trainable_parameters": trainable, "total_parameters": total, "val_loss_before": 4.1234,
            "val_loss_after": after, "train_time_s": train_time_s, "step_median_s": step_median_s, "checkpoint_bytes": checkpoint_bytes,
        }  # fmt: skip

    data = {
        "machine": MACHINE,
        "lora": {
            "base": {"data": "/somewhere/poems.txt", "steps": 400, "final_val_loss": 2.3456, "train_time_s": 88.84},
            "second_text": {"files": ["docs/a.md", "docs/b.md"], "characters": 12345, "replaced_by_a_space": 678},
            "fine_tuning_steps": 150,
            "runs": [
                run("LoRA r=2", 11264, 815360, 2.6789, 12.34, 0.02567, 204800),
                run("full fine-tuning", 804096, 804096, 2.2222, 1234.5, 0.03456, 9_999_360),
            ],
        },
    }  # fmt: skip
    assert_lines(markdown_of("lora", data), [
        (
            "The base: 400 steps on poems.txt (88.8 s of training), val loss 2.3456. The second text: 2 files of docs/, "
            "12,345 characters, 678 of them replaced by a space (not in the base's vocabulary)."
        ),
        "| method (150 steps on docs/) | trainable parameters | val loss before | val loss after | training time (s) | one step, median (ms) | checkpoint (KiB) |",
        "| LoRA r=2 | 11,264 (1.38%) | 4.1234 | 2.6789 | 12.3 | 25.7 | 200 |",
        "| full fine-tuning | 804,096 (100.00%) | 4.1234 | 2.2222 | 1,234.5 | 34.6 | 9,765 |",
        CONDITIONS,
    ])  # fmt: skip
