"""bench/README.md is generated, and must stay so: each elective case's section is its
markdown(data) of the JSON it wrote, and the file is exactly what bench/run.py's report() builds
from bench/results/, one section per CPU (bench/results/CPU/), each naming its CPU and vector ISA.

Each case's rendering is also checked on a small made-up result, whole table lines at a time, so
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
RESULTS = BENCH / "results"  # one folder per CPU
sys.path.insert(0, str(BENCH))  # run.py imports the harness and the cases from there
run = importlib.import_module("run")
harness = importlib.import_module("harness")
cases = importlib.import_module("cases")

ELECTIVES = [case for case in cases.CASES if case.elective]
CORE = [case for case in cases.CASES if not case.elective]
MACHINE = {"date": "2031-05-06", "processor": "Made-up CPU", "isa": "avx2, avx512f", "cores": 3, "numpy": "9.8.7", "numba": "6.5.4", "torch": "1.2.3"}
CONDITIONS = "Measured on 2031-05-06: Made-up CPU (vector ISA: avx2, avx512f), 3 cores, numpy 9.8.7, numba 6.5.4, PyTorch 1.2.3."


def keeping_the_environment(function, *args):
    """function(*args) with os.environ put back afterwards, so that nothing a case module sets on
    import reaches the programs that later tests start."""
    environment = dict(os.environ)
    try:
        return function(*args)
    finally:
        os.environ.clear()
        os.environ.update(environment)


def case_module(name):
    """The module of case `name` (cases.CASES)."""
    return keeping_the_environment(cases.BY_NAME[name].module)


def markdown_of(name, data):
    """The markdown the elective case `name` makes of `data`."""
    return case_module(name).markdown(data)


def assert_lines(text, expected):
    lines = text.splitlines()
    missing = [line for line in expected if line not in lines]
    assert not missing, "missing lines:\n" + "\n".join(missing) + "\n\nin:\n" + text


def section(report, title, level="##"):
    """The text of the report's section `## title` (or `### title` with level="###"), up to the
    next section of that level or above."""
    start = report.index(f"\n{level} {title}\n") + 1
    ends = [report.find(f"\n{'#' * n} ", start) for n in range(2, len(level) + 1)]
    ends = [end for end in ends if end != -1]
    return report[start : min(ends) if ends else len(report)]


def cpu_section(report, folder):
    """The section of the CPU whose results are in `folder`."""
    return section(report, harness.folder_machine(folder, cases.CASES)["processor"])


def folder_with(case):
    """The first CPU folder (most results first) holding the case's results."""
    folders = [folder for folder in harness.cpu_folders(RESULTS) if (folder / f"{case.name}.json").exists()]
    assert folders, f"no bench/results/CPU/{case.name}.json: the repository keeps every case's latest results on at least one CPU"
    return folders[0]


@pytest.fixture(scope="module")
def report():
    return keeping_the_environment(run.report, RESULTS)


# --------------------------------------------------------------------------------- the README


@pytest.mark.parametrize("case", ELECTIVES, ids=[case.name for case in ELECTIVES])
def test_each_measured_technique_has_its_section_and_a_table(report, case):
    text = section(cpu_section(report, folder_with(case)), case.title, "###")
    assert f"From `python bench/run.py {case.name}`" in text
    assert re.search(r"^\|.*\|\n\|(-+:?\|)+$", text, re.MULTILINE), f"no markdown table in the section {title!r}:\n{text}"
    assert "Measured on " in text


@pytest.mark.parametrize("case", CORE, ids=[case.name for case in CORE])
def test_each_core_case_has_its_rows_or_its_section_with_a_table(report, case):
    folder = folder_with(case)
    module, data = case_module(case.name), harness.load(folder, case.name)
    here = cpu_section(report, folder)
    rows = getattr(module, "result_rows", lambda data: [])(data)
    own_sections = getattr(module, "sections", lambda data: [])(data)
    assert rows or own_sections, f"the case {case.name} renders nothing"
    results = section(here, "Results", "###").splitlines()
    assert all(row in results for row in rows), f"the Results table lacks a row of {case.name}"
    for title, lines in own_sections:
        text = "\n".join(lines)
        assert re.search(r"^\|.*\|\n\|(-+:?\|)+$", text, re.MULTILINE), f"no markdown table in the section {title!r}:\n{text}"
        assert text in section(here, title, "###")


def test_the_readme_is_what_run_builds_from_the_results(report):
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    assert readme == report, "bench/README.md differs from its generator: run `python bench/run.py --report-only`"


def test_the_readme_explains_the_process_tuning(report):
    text = section(report, "Process tuning")
    assert "tune_for_training()" in text and "malloc" in text and "GOMP_SPINCOUNT" in text


def test_the_conditions_line_names_date_cpu_cores_versions_and_load():
    assert harness.conditions_line(MACHINE) == CONDITIONS
    assert harness.conditions_line(MACHINE, load=[3.1, 4.7]) == CONDITIONS[:-1] + ", load average 3.1 before, 4.7 after."
    assert harness.conditions_line({**MACHINE, "load_average_1min_before_after": [3.1, 4.7]}) == CONDITIONS[:-1] + ", load average 3.1 before, 4.7 after."
    without_torch = {**MACHINE, "torch": "(not installed)"}
    assert harness.conditions_line(without_torch) == "Measured on 2031-05-06: Made-up CPU (vector ISA: avx2, avx512f), 3 cores, numpy 9.8.7, numba 6.5.4."
    recorded_before_the_isa = {key: value for key, value in MACHINE.items() if key != "isa"}
    assert harness.conditions_line(recorded_before_the_isa) == CONDITIONS.replace("avx2, avx512f", "not recorded")


def test_the_vector_isa_is_read_from_the_cpu_flags(monkeypatch):
    flags = {"flags": "fpu sse2 avx avx2 fma avx512f avx512bw", "Features": None}
    monkeypatch.setattr(harness, "_cpuinfo", lambda field: flags.get(field))
    assert harness.vector_isa() == "avx2, avx512f"
    flags = {"flags": None, "Features": "fp asimd evtstrm aes"}
    assert harness.vector_isa() == "neon"
    flags = {"flags": None, "Features": "fp asimd sve sve2 bf16"}
    assert harness.vector_isa() == "neon, sve"
    flags = {"flags": "fpu sse2 avx2 avx512f avx512_bf16 avx512_fp16 amx_tile amx_int8", "Features": None}
    assert harness.vector_isa() == "avx2, avx512f, avx512_bf16, avx512_fp16, amx"
    flags = {"flags": "fpu sse2", "Features": None}
    assert harness.vector_isa() == "none of avx2, avx512f, avx512_bf16, avx512_fp16, amx, neon, sve"


def test_on_macos_the_cpu_and_its_isa_come_from_sysctl(monkeypatch):
    answers = {"machdep.cpu.brand_string": "Apple M3", "hw.optional.neon": "1", "hw.optional.avx2_0": None}
    monkeypatch.setattr(harness, "_cpuinfo", lambda field: None)
    monkeypatch.setattr(harness, "_sysctl", answers.get)
    monkeypatch.setattr(harness.sys, "platform", "darwin")
    assert harness.vector_isa() == "neon"
    assert harness.cpu_name() == "Apple M3" and harness.cpu_id() == "Apple M3"
    assert harness.cpu_slug(harness.cpu_name()) == "apple-m3"


@pytest.mark.parametrize(
    "model_name, vendor, family, model, flags, name, slug",
    [
        ("Intel(R) Xeon(R) Processor", "GenuineIntel", "6", "143", "avx2 avx512f amx_tile", "Intel Xeon (Sapphire Rapids)", "intel-xeon-sapphire-rapids"),
        ("Intel(R) Xeon(R) Processor", "GenuineIntel", "6", "207", "avx2 avx512f amx_tile", "Intel Xeon (Emerald Rapids)", "intel-xeon-emerald-rapids"),
        ("Intel(R) Xeon(R) Platinum 8480+", "GenuineIntel", "6", "143", "amx_tile", "Intel Xeon Platinum 8480+ (Sapphire Rapids)", "intel-xeon-platinum-8480-sapphire-rapids"),
        ("Intel(R) Core(TM) i7-1165G7 @ 2.80GHz", "GenuineIntel", "6", "140", "avx2 avx512f", "Intel Core i7-1165G7 (Tiger Lake)", "intel-core-i7-1165g7-tiger-lake"),
        # a virtual machine reporting a part without AMX while the flags have it: the flags win
        ("Intel(R) Xeon(R) Processor", "GenuineIntel", "6", "167", "avx2 avx512f avx512_fp16 amx_tile",
         "Intel Xeon (with AMX and AVX512-FP16: Sapphire Rapids or later; reports family 6 model 167)", "intel-xeon-sapphire-rapids-or-later"),
        ("Intel(R) Xeon(R) Processor", "GenuineIntel", "6", "999", "avx2", "Intel Xeon (family 6 model 999)", "intel-xeon-family-6-model-999"),
        ("AMD EPYC 7B13 64-Core Processor", "AuthenticAMD", "25", "1", "avx2", "AMD EPYC 7B13 (Zen 3 / Zen 4)", "amd-epyc-7b13-zen-3-zen-4"),
        ("AMD EPYC", "AuthenticAMD", "99", "1", "avx2", "AMD EPYC (family 99 model 1)", "amd-epyc-family-99-model-1"),
    ],
)  # fmt: skip
def test_the_cpu_is_named_from_vendor_family_and_model(model_name, vendor, family, model, flags, name, slug):
    assert harness.cpu_name(model_name, vendor, family, model, flags) == name
    assert harness.cpu_slug(name) == slug
    assert harness.results_folder("/results", {"processor": name, "cpu_slug": slug}) == Path("/results") / slug


def test_each_cpu_gets_its_own_section_naming_it_and_its_isa(tmp_path):
    """Results of two CPUs side by side (bench/results/CPU/NAME.json): one section each, under the
    CPU's name, with its ISA, its own rows, and a row in the table of CPUs."""
    real = harness.load(folder_with(cases.BY_NAME["profile"]), "profile")
    for name, isa, slug in (("Made-up CPU A", "avx2", "made-up-cpu-a"), ("Made-up CPU B (Zen 9)", "neon, sve", "made-up-cpu-b-zen-9")):
        (tmp_path / slug).mkdir()
        data = {**real, "machine": {**real["machine"], "processor": name, "isa": isa, "cpu_slug": slug}}
        (tmp_path / slug / "profile.json").write_text(__import__("json").dumps(data))
    text = keeping_the_environment(run.report, tmp_path)
    table = section(text, "The CPUs measured")
    assert "| Made-up CPU A | avx2 | `bench/results/made-up-cpu-a/`: 1 of" in table
    assert "| Made-up CPU B (Zen 9) | neon, sve | `bench/results/made-up-cpu-b-zen-9/`: 1 of" in table
    for name, isa in (("Made-up CPU A", "avx2"), ("Made-up CPU B (Zen 9)", "neon, sve")):
        here = section(text, name)
        assert f"Vector ISA: {isa}." in here
        assert "### Where a step's time goes" in here


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


# --------------------------------------------------------------------------------- the core cases' rows and sections


def test_train_rows_and_sections():
    def phases(forward, backward, optimizer, tokens_per_s, mfu):
        return {"forward": forward, "backward": backward, "optimizer": optimizer, "step": forward + backward + optimizer,
                "tokens_per_s": tokens_per_s, "mfu": mfu, "steps": 30}  # fmt: skip

    libraries = {"microtensor": phases(0.010, 0.020, 0.001, 24000.0, 0.634), "pytorch": phases(0.012, 0.024, 0.003, 12000.0, 0.5)}
    data = {
        "train": {
            "libraries": libraries, "gemm_peak_flops": 123.4e9, "block": 4,
            "spread": {"microtensor_step_s": {"min": 0.030, "median": 0.031, "max": 0.0325}, "step_ratio_by_block": {"min": 1.1, "median": 1.25, "max": 1.3}},
        },
        "kernel_sets": {"readable": phases(0.1, 0.2, 0.01, 2000.0, 0.1), "fast": phases(0.01, 0.02, 0.001, 24000.0, 0.6)},
    }  # fmt: skip
    train = case_module("train")
    assert train.result_rows(data) == [
        "| training forward (ms) | 10.0 | 12.0 | 1.20× |  |  |",
        "| training backward (ms) | 20.0 | 24.0 | 1.20× |  |  |",
        "| training optimizer (ms) | 1.0 | 3.0 | 3.00× |  |  |",
        "| training step (ms) | 31.0 | 39.0 | 1.26× | 1.10-1.30× | ≥ 1.5× |",
        "| training tokens/s | 24,000 | 12,000 | 2.00× | | ≥ 1.5× |",
        "| model FLOP utilization (GEMM peak 123 GFLOP/s) | 63% | 50% | | | ≥ 50% |",
    ]
    libraries["pytorch_compiled"] = phases(0.009, 0.018, 0.003, 16000.0, 0.55)
    assert train.result_rows(data)[-1] == "| training step, PyTorch under torch.compile (ms) | 31.0 | 30.0 | 0.97× | | |"
    libraries["jax"] = {"step": 0.093, "tokens_per_s": 8000.0, "mfu": 0.2, "steps": 30}  # a whole jitted step: no phases
    data["train"]["versions"] = {"jax": "0.10.2"}
    data["train"]["spread"]["jax_step_ratio_by_block"] = {"min": 2.5, "median": 3.0, "max": 3.5}
    assert train.result_rows(data)[-1] == (
        "| training step, JAX 0.10.2 with the whole step under jax.jit, in the PyTorch column (ms) | 31.0 | 93.0 | 3.00× | 2.50-3.50× | |"
    )
    assert train.default_environment_rows(data) == ["| training tokens/s, OPENBLAS variables kept | 24,000 | 12,000 | 2.00× | | |"]
    assert train.noise_lines(data) == [
        "- microtensor's training step over the run's 30 timed steps: 30.0-32.5 ms (median 31.0).",
        "- the step's ratio over the blocks of 4 steps: 1.10-1.30× (median 1.25×).",
    ]
    [(title, lines)] = train.sections(data)
    assert title == "The two kernel sets"
    assert_lines("\n".join(lines), ["| step | 310.0 | 31.0 | 10.00× |", "| tokens/s | 2,000 | 24,000 | |"])


def test_ops_rows():
    row = {"op": "gelu (8, 8)", "forward_backward_s": 0.000123, "torch_forward_backward_s": 0.000246, "forward_backward_ratio": 2.0,
           "forward_backward_ratio_spread": {"min": 1.5, "median": 2.0, "max": 2.25}}  # fmt: skip
    alone = {"op": "AdamW step (9 params)", "forward_backward_s": 0.001, "torch_forward_backward_s": None, "forward_backward_ratio": None}
    assert case_module("ops").result_rows({"ops": [row, alone]}) == [
        "| gelu (8, 8), fwd+bwd (µs) | 123 | 246 | 2.00× | 1.50-2.25× | ≥ 1× |",
        "| AdamW step (9 params), fwd+bwd (µs) | 1000 | - | - |  | ≥ 1× |",
    ]


def test_generate_startup_and_convergence_rows():
    generate = {"tokens": 99, "microtensor_kv_cache_tokens_per_s": 5000.4, "pytorch_kv_cache_tokens_per_s": 1000.0, "kv_cache_vs_pytorch": 5.0004,
                "microtensor_recompute_tokens_per_s": 100.0, "pytorch_recompute_tokens_per_s": None, "kv_cache_vs_recompute": 50.004}  # fmt: skip
    assert case_module("generate").result_rows({"generate": generate}) == [
        "| generation with KV cache, 1→100 tokens (tokens/s) | 5,000 | 1,000 | 5.00× | | ≥ 2× |",
        "| generation recomputing the context (tokens/s) | 100 | - | cache 50.00× faster | | cache ≥ 5× |",
    ]
    generate.update(jax_kv_cache_tokens_per_s=2500.0, kv_cache_vs_jax=2.00016, jax_version="0.10.2")
    assert case_module("generate").result_rows({"generate": generate})[-1] == (
        "| generation with KV cache, JAX 0.10.2 one jitted step per token, in the PyTorch column (tokens/s) | 5,000 | 2,500 | 2.00× | | ≥ 2× |"
    )
    startup = {"import_microtensor_s": 0.4321, "train_max_iters_1_cold_s": 11.06, "train_max_iters_1_warm_s": 1.24,
               "peak_rss_training_mib": 190.4, "peak_rss_iters": 50}  # fmt: skip
    assert case_module("startup").result_rows({"startup": startup}) == [
        "| `import microtensor` (s) | 0.43 | | | | ≤ 0.5 s |",
        "| `train.py --max-iters 1`, empty Numba cache (s) | 11.1 | | | | ≤ 10 s |",
        "| `train.py --max-iters 1`, filled cache (s) | 1.2 | | | | ≤ 3 s |",
        "| peak RSS training the default recipe for 50 steps, filled Numba cache (MiB) | 190 | | | | ≤ 200 MiB |",
    ]
    assert case_module("startup").sections({"startup": startup}) == []  # recorded before the compile list
    startup.update(train_max_iters_1_cold_cpu_s=9.54, cold_compiled={"compilations": 20, "kernels": {f"pkg.k{i}": 2.0 - i / 10 for i in range(14)}})
    assert case_module("startup").result_rows({"startup": startup})[2] == "| the same, CPU seconds (user + system) | 9.5 | | | | |"
    [(title, lines)] = case_module("startup").sections({"startup": startup})
    assert title == "What a cold start compiles"
    assert_lines("\n".join(lines), [
        "`train.py --max-iters 1` with an empty Numba cache: 11.1 s wall, 9.5 s CPU; 18.9 s of it compiling 14 kernels "
        "(20 compilations, a kernel's callees counted in its own time). The slowest:",
        "| kernel | compile (s) | share of compiling |",
        "| `pkg.k0` | 2.00 | 11% |",
        "| `pkg.k11` | 0.90 | 5% |",
        "| 2 more | 1.50 | 8% |",
    ])  # fmt: skip
    startup["cold_compiled"]["kernels_cpu"] = {f"pkg.k{i}": 1.0 - i / 20 for i in range(14)}  # bench/compile_times.py's CPU seconds
    [(_, lines)] = case_module("startup").sections({"startup": startup})
    assert_lines("\n".join(lines), [
        "`train.py --max-iters 1` with an empty Numba cache: 11.1 s wall, 9.5 s CPU; 9.4 CPU seconds of it compiling 14 kernels "
        "(20 compilations, a kernel's callees counted in its own time). The slowest:",
        "| kernel | compile CPU (s) | share of compiling |",
        "| `pkg.k0` | 1.00 | 11% |",
    ])  # fmt: skip
    convergence = {"steps": 1500, "final_val_loss": 1.87654, "data": "/somewhere/poems.txt"}
    assert case_module("convergence").result_rows({"convergence": convergence}) == [
        "| val loss after 1500 steps on poems.txt | 1.8765 | | | | ≤ 1.90 |"
    ]


def test_profile_section():
    functions = [{"function": f"Op{i}", "phase": "forward", "ms_per_step": 2.0 - i / 10, "calls_per_step": 4.0, "us_per_call": 500.0 - i} for i in range(13)]
    data = {"profile": {"steps": 20, "kernels": "fast", "phases_ms": {"step": 40.04, "forward": 15.0, "backward": 24.0, "optimizer": 1.04},
                        "functions": functions, "outside_functions_ms": 3.5, "mean_step_ms": 22.7}}  # fmt: skip
    [(title, lines)] = case_module("profile").sections(data)
    assert title == "Where a step's time goes"
    assert_lines("\n".join(lines), [
        "| Function | phase | ms / step | calls / step | µs / call |",
        "| Op0 | forward | 2.00 | 4 | 500 |",
        "| Op11 | forward | 0.90 | 4 | 489 |",
        "| 1 more rows | | 0.80 | | |",
        "| all Functions | | 18.20 | | |",
        "| everything else (the backward walk, Python between ops, the optimizer's loop) | | 3.50 | | |",
        "| the step (mean) | | 22.70 | | |",
    ])  # fmt: skip


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="it lists what Numba compiles")
def test_compile_times_names_a_tagged_compilation_by_its_tag(tmp_path):
    """A loop compiled twice (kernel(tag=...): with threads and without, say) is listed twice, each
    by its tag, so that a cold start's table says which of the two compiled."""
    import json
    import subprocess

    script = tmp_path / "two_compilations.py"
    script.write_text(
        "import numpy as np\n"
        "from microtensor.kernels import kernel\n"
        "def double(x):\n"
        "    return 2 * x[0]\n"
        "kernel(double)(np.ones(1))\n"
        "kernel(tag='serial')(double)(np.ones(1))\n"
    )
    environment = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(BENCH / "compile_times.py"), str(script)], cwd=ROOT, env=environment,
                          capture_output=True, text=True, check=True)  # fmt: skip
    kernels = json.loads(done.stdout.strip().splitlines()[-1])["kernels_cpu"]
    assert sorted(kernels) == ["__main__.double", "__main__.double (serial)"], kernels


def test_a_generated_part_replaces_only_what_lies_between_its_lines():
    """A case that regenerates a docs page keeps the prose around its part, and refuses a page that
    lacks the two lines (its whole text would be lost)."""
    from microtensor import MicrotensorError

    begin, end = "<!-- begin -->", "<!-- end -->"
    page = f"prose before\n{begin}\n\nold table\n{end}\nprose after\n"
    assert harness.page_with_generated_part("case", page, "new table\n", begin, end) == f"prose before\n{begin}\n\nnew table\n\n{end}\nprose after\n"
    with pytest.raises(MicrotensorError, match="case: the page lacks the lines that mark its generated part"):
        harness.page_with_generated_part("case", "prose alone\n", "new table\n", begin, end)
