"""The table of cases: what bench/run.py measures, one small module per case. The core cases measure
the default GPT (its training step, ops, generation, start-up, convergence); the electives, in
electives/, measure the techniques of docs/ (each has its section in bench/README.md).

A case module says only what to build and measure and how to render it (bench/harness.py runs it):

    options(parser)          its own flags, if any
    measure(args, machine)   the results, a dict written to bench/results/CPU/NAME.json
                             (`machine` is the harness's record of the conditions: keep it in)
    result_rows(data)        core: its rows of the README's Results table
    sections(data)           core: [(title, lines)], its own README sections
    noise_lines(data)        core: what it measured of the run's noise ("How much a run moves")
    markdown(data)           elective: its README section
"""
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str  # its results are bench/results/CPU/NAME.json; `python bench/run.py NAME` runs it
    module_name: str
    title: str = None  # an elective's README section
    doc: str = None  # the docs page that explains an elective's technique

    @property
    def elective(self):
        return self.title is not None

    def module(self):
        return importlib.import_module(f"cases.{self.module_name}")


CASES = [
    Case("train", "train"),
    Case("ops", "ops"),
    Case("profile", "profile"),
    Case("generate", "generate"),
    Case("startup", "startup"),
    Case("convergence", "convergence"),
    Case("attention", "electives.attention", "Online-softmax attention against the standard kernel", "docs/electives/online-attention.md"),
    Case("variants", "electives.variants", "GQA, positions, experts and tokenizers, trained", "docs/electives/positions.md"),
    Case("decode_variants", "electives.decode_variants", "Generation's one-token kernel for each variant", "docs/electives/grouped-query-attention.md"),
    Case("tokenizer", "electives.tokenizer", "Training and running the BPE tokenizer", "docs/electives/bpe.md"),
    Case("decoding", "electives.decoding", "Beam search and speculative decoding", "docs/electives/speculative-decoding.md"),
    Case("quantize", "electives.quantize", "int8 and int4 weights", "docs/electives/quantization.md"),
    Case("lora", "electives.lora", "LoRA fine-tuning", "docs/electives/lora.md"),
    Case("checkpointing", "electives.checkpointing", "Gradient checkpointing", "docs/electives/checkpointing.md"),
    Case("dpo", "electives.dpo", "Direct preference optimization", "docs/electives/dpo.md"),
    Case("mtp", "electives.mtp", "Multi-token prediction and self-speculative decoding", "docs/electives/multi-token-prediction.md"),
    Case("mixed_precision", "electives.mixed_precision", "16-bit training", "docs/electives/mixed-precision.md"),
    Case("latent_attention", "electives.latent_attention", "Multi-head latent attention against MHA, GQA and MQA", "docs/electives/latent-attention.md"),
    Case("scaling_laws", "electives.scaling_laws", "Scaling laws: a sweep of sizes and an IsoFLOP curve", "docs/electives/scaling-laws.md"),
    Case("test_time_compute", "electives.test_time_compute", "Test-time compute: self-consistency and best-of-n", "docs/electives/test-time-compute.md"),
    Case("ssm", "electives.ssm", "A selective state-space model against attention", "docs/electives/state-space-models.md"),
    Case("policy_gradient", "electives.policy_gradient", "Policy gradients with a verifiable reward", "docs/electives/policy-gradient.md"),
]
BY_NAME = {case.name: case for case in CASES}
