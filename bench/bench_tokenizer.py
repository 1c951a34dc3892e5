"""The byte-level BPE tokenizer (models/bpe.py) on tinyshakespeare: training time, encoding speed, characters per token.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_tokenizer.py [--json FILE] [--repeat N]

For each vocabulary size the tokenizer is trained on the whole of ../shared/data/tinyshakespeare.txt
(beside the project's folder, as tests/test_programs.py finds it), then encodes the whole text. A
time is the median of --repeat runs (default 3), each in this process, one after the other; encode
throughput is the text's UTF-8 bytes over the median encode time (each encode starts with an empty
cache: its cache lives in one call). The script checks that every encoding decodes back to the
text before it reports anything. The character tokenizer (models/data.py) is measured alike, as
the baseline: its "training" is collecting the set of characters.

Writes bench/results/tokenizer.json unless --json names another file.
"""
from common import ROOT, console, machine_info, parser, print_machine, write_json  # isort: skip  (before models: it puts the checkout on sys.path)
import statistics
import time

from rich.table import Table

from models.bpe import BytePairTokenizer
from models.data import CharTokenizer

TINYSHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
VOCAB_SIZES = (512, 1024, 2048)
DEFAULT_REPEAT = 3
DEFAULT_JSON = ROOT / "bench" / "results" / "tokenizer.json"


def median_seconds(fn, repeat):
    """(median seconds of repeat calls of fn, fn's last result)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure(name, train, text, repeat):
    """Train and encode timings of one tokenizer; train() -> the tokenizer."""
    train_s, tokenizer = median_seconds(train, repeat)
    encode_s, ids = median_seconds(lambda: tokenizer.encode(text), repeat)
    if tokenizer.decode(ids) != text:
        raise SystemExit(f"bench_tokenizer: {name} does not decode its encoding of the text back to the text")
    n_bytes = len(text.encode("utf-8"))
    return {
        "tokenizer": name,
        "vocab_size": tokenizer.vocab_size,
        "train_s": train_s,
        "encode_s": encode_s,
        "encode_mb_per_s": n_bytes / encode_s / 1e6,
        "tokens": len(ids),
        "chars_per_token": len(text) / len(ids),
    }


def show(rows, text):
    table = Table(title=f"tokenizers on tinyshakespeare ({len(text):,} characters; times are medians)")
    for column in ("tokenizer", "vocab", "train", "encode", "MB/s", "tokens", "chars/tok"):
        table.add_column(column, justify="left" if column == "tokenizer" else "right")
    for row in rows:
        table.add_row(
            row["tokenizer"], str(row["vocab_size"]), f"{row['train_s']:.2f} s", f"{row['encode_s']:.2f} s",
            f"{row['encode_mb_per_s']:.2f}", f"{row['tokens']:,}", f"{row['chars_per_token']:.2f}",
        )  # fmt: skip
    console.print(table)


def main():
    p = parser(__doc__.splitlines()[0])
    p.set_defaults(json=str(DEFAULT_JSON))
    args = p.parse_args()
    if not TINYSHAKESPEARE.is_file():
        raise SystemExit(f"bench_tokenizer: {TINYSHAKESPEARE} is missing; the benchmark trains on it")
    text = TINYSHAKESPEARE.read_bytes().decode("utf-8")
    info = machine_info()
    print_machine(info)
    repeat = args.repeat or DEFAULT_REPEAT
    rows = [measure("char", lambda: CharTokenizer.from_text(text), text, repeat)]
    for vocab_size in VOCAB_SIZES:
        rows.append(measure(f"bpe {vocab_size}", lambda v=vocab_size: BytePairTokenizer.train(text, v), text, repeat))
        console.print(f"bpe {vocab_size}: trained in {rows[-1]['train_s']:.2f} s")
    show(rows, text)
    write_json(args.json, {"machine": info, "tokenizer": {"corpus": TINYSHAKESPEARE.name, "characters": len(text), "repeat": repeat, "rows": rows}})


if __name__ == "__main__":
    main()
