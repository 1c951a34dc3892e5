"""The byte-level BPE tokenizer (gpt/text/electives/bpe.py) on tinyshakespeare: training time, encoding speed, characters per token.

For each vocabulary size the tokenizer is trained on the whole of ../shared/data/tinyshakespeare.txt
(beside the project's folder, as tests/test_programs.py finds it), then encodes the whole text. A
time is the median of --repeat runs (default 3), each in this process, one after the other; encode
throughput is the text's UTF-8 bytes over the median encode time (each encode starts with an empty
cache: its cache lives in one call). The case checks that every encoding decodes back to the
text before it reports anything. The character tokenizer (gpt/text/data.py) is measured alike, as
the baseline: its "training" is collecting the set of characters.
"""
from pathlib import Path

from harness import TINYSHAKESPEARE, conditions_line, median_seconds

from gpt.text.electives.bpe import BytePairTokenizer
from gpt.text.data import CharTokenizer

VOCAB_SIZES = (512, 1024, 2048)


def options(p):
    p.add_argument("--data", default=str(TINYSHAKESPEARE), help="the text to train on and encode")


def measure(args, machine):
    corpus = Path(args.data)
    if not corpus.is_file():
        raise SystemExit(f"bench tokenizer: {corpus} is missing; the case trains on it")
    text = corpus.read_bytes().decode("utf-8")
    repeat = args.repeat or 3
    rows = [measure_one("char", lambda: CharTokenizer.from_text(text), text, repeat)]
    for vocab_size in VOCAB_SIZES:
        rows.append(measure_one(f"bpe {vocab_size}", lambda v=vocab_size: BytePairTokenizer.train(text, v), text, repeat))
        print(f"bpe {vocab_size}: trained in {rows[-1]['train_s']:.2f} s", flush=True)
    return {"machine": machine, "tokenizer": {"corpus": corpus.name, "characters": len(text), "repeat": repeat, "rows": rows}}


def measure_one(name, train, text, repeat):
    """Train and encode timings of one tokenizer; train() -> the tokenizer."""
    train_s, tokenizer = median_seconds(train, repeat)
    encode_s, ids = median_seconds(lambda: tokenizer.encode(text), repeat)
    if tokenizer.decode(ids) != text:
        raise SystemExit(f"bench tokenizer: {name} does not decode its encoding of the text back to the text")
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


COLUMNS = ("tokenizer", "vocab", "train (s)", "encode (s)", "encode (MB/s)", "tokens", "chars/token")


def row_cells(row):
    return [
        row["tokenizer"], f"{row['vocab_size']:,}", f"{row['train_s']:,.2f}", f"{row['encode_s']:,.2f}",
        f"{row['encode_mb_per_s']:,.2f}", f"{row['tokens']:,}", f"{row['chars_per_token']:.2f}",
    ]  # fmt: skip


def markdown(data):
    """The table of a run's JSON (the dict measure() returns), and the conditions it ran under."""
    results = data["tokenizer"]
    lines = [
        f"Tokenizers on {results['corpus']} ({results['characters']:,} characters); times are medians of {results['repeat']} runs:",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ]
    lines += ["| " + " | ".join(row_cells(row)) + " |" for row in results["rows"]]
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)
