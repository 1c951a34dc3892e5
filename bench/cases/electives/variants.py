"""The transformer variants, measured: what each costs and what it buys on tinyshakespeare.

    python bench/run.py variants [--steps 600] [--seconds 60] [--tables positions ...]

Four tables, each from models trained here with the default recipe's shapes (4 layers, 4 heads,
128 wide, batch 12, AdamW at 1e-3 with the cosine schedule of train.py) on the same batches:
- the KV cache's bytes per token for multi-head, grouped-query and multi-query attention;
- position schemes: val loss at the training context (64) and at twice it (128), for learned, rotary,
  sinusoidal and ALiBi positions (a learned table has no rows past 64, so it has no second figure);
- mixture of experts (4 experts, top 2, aux weight 0.01) against the dense GELU MLP at equal steps:
  val loss, and each block's share of tokens per expert (utilization) at the end;
- char against byte-level BPE (vocabulary 512) at equal training time: val loss in bits per
  character, which compares tokenizers (a BPE token covers about two characters).

--tables runs only some tables and keeps the others from the results file's last run.
"""
import json
import time
from pathlib import Path

import numpy as np
from harness import TINYSHAKESPEARE, conditions_line

import microtensor as mt
from microtensor import optim
from gpt.text.electives.bpe import BytePairTokenizer, bits_per_character, count_characters
from gpt.text.data import Batches, CharTokenizer
from gpt.model.transformer import GPT, GPTConfig

RECIPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64)
BATCH, EVAL_BATCHES = 12, 40
TABLES = ["kv_cache", "positions", "experts", "tokenizers"]


def train(config, batches, steps=None, seconds=None, aux_weight=0.0, seed=1337):
    """Train from scratch for `steps` steps or `seconds` of wall time; returns (model, steps done)."""
    mt.manual_seed(seed)
    model = GPT(config)
    opt = optim.AdamW(optim.weight_decay_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99))
    rng = np.random.default_rng(seed)
    total = steps if steps is not None else 10**9
    started, step = time.perf_counter(), 0
    while step < total and (seconds is None or time.perf_counter() - started < seconds):
        decay_steps = steps if steps is not None else max(step + 1, 1)
        for group in opt.param_groups:
            group["lr"] = optim.cosine_with_warmup(step, 1e-3, 1e-4, min(100, decay_steps // 10), decay_steps)
        x, y = batches.get("train", BATCH, rng)
        _, loss = model(mt.tensor(x), mt.tensor(y))
        aux = model.moe_aux_loss()
        if aux is not None and aux_weight:
            loss = loss + aux_weight * aux
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm(model.parameters(), 1.0)
        opt.step()
        step += 1
    return model, step


@mt.no_grad()
def val_loss(model, batches, context, seed=7):
    """Mean loss in nats per token over EVAL_BATCHES val windows of `context` tokens."""
    rng = np.random.default_rng(seed)
    part = batches.splits["val"]
    losses = []
    for _ in range(EVAL_BATCHES):
        starts = rng.integers(0, len(part) - context - 1, BATCH)
        x = np.stack([part[s : s + context] for s in starts]).astype(np.int64)
        y = np.stack([part[s + 1 : s + 1 + context] for s in starts]).astype(np.int64)
        losses.append(model(mt.tensor(x), mt.tensor(y))[1].item())
    return float(np.mean(losses))


def kv_cache_table(vocab_size):
    rows = []
    for n_kv_head, name in ((4, "multi-head"), (2, "grouped-query (2 groups)"), (1, "multi-query")):
        model = GPT(GPTConfig(vocab_size=vocab_size, n_kv_head=n_kv_head, **RECIPE))
        keys, values = model.new_cache_arrays(1)
        measured = (keys.nbytes + values.nbytes) // RECIPE["block_size"]
        assert measured == model.kv_cache_bytes_per_token()
        rows.append({"attention": name, "n_kv_head": n_kv_head, "bytes_per_token": measured, "parameters": model.num_parameters()})
    return rows


def positions_table(batches, vocab_size, steps):
    rows = []
    for pos in ("learned", "rope", "sinusoidal", "alibi"):
        model, _ = train(GPTConfig(vocab_size=vocab_size, pos=pos, **RECIPE), batches, steps=steps)
        at_context = val_loss(model, batches, 64)
        at_double = None if pos == "learned" else val_loss(model, batches, 128)
        rows.append({"pos": pos, "val_loss_64": at_context, "val_loss_128": at_double})
        print(rows[-1])
    return rows


def experts_table(batches, vocab_size, steps):
    rows = []
    for mlp in ("gelu", "moe"):
        config = GPTConfig(vocab_size=vocab_size, mlp=mlp, n_expert=4, expert_top_k=2, **RECIPE)
        started = time.perf_counter()
        model, _ = train(config, batches, steps=steps, aux_weight=0.01)
        seconds = time.perf_counter() - started
        row = {"mlp": mlp, "parameters": model.num_parameters(), "val_loss": val_loss(model, batches, 64), "train_seconds": seconds}
        if mlp == "moe":
            x, _ = batches.get("val", BATCH, np.random.default_rng(3))
            with mt.no_grad():
                model(mt.tensor(x))
            counts = model.tokens_per_expert()  # (n_layer, E)
            row["share_per_expert"] = (counts / counts.sum(axis=1, keepdims=True)).round(3).tolist()
        rows.append(row)
        print(row)
    return rows


def tokenizer_table(text, seconds):
    rows = []
    for name in ("char", "bpe 512"):
        started = time.perf_counter()
        tokenizer = CharTokenizer.from_text(text) if name == "char" else BytePairTokenizer.train(text, 512)
        tokenizer_seconds = time.perf_counter() - started
        ids = tokenizer.encode(text, dtype=tokenizer.id_dtype)
        batches = Batches(ids, RECIPE["block_size"])
        model, steps = train(GPTConfig(vocab_size=tokenizer.vocab_size, **RECIPE), batches, seconds=seconds)
        loss = val_loss(model, batches, 64)
        val = batches.splits["val"]
        characters = len(tokenizer.decode(val)) if name == "char" else count_characters(tokenizer.decode_bytes(val))
        rows.append({
            "tokenizer": name, "vocab_size": tokenizer.vocab_size, "tokenizer_seconds": tokenizer_seconds,
            "chars_per_token": characters / len(val), "train_seconds": seconds, "steps": steps,
            "val_loss_per_token": loss, "val_bits_per_char": bits_per_character(loss, len(val), characters),
        })  # fmt: skip
        print(rows[-1])
    return rows


def markdown(results):
    """The four tables of a run's JSON (the dict measure() returns), and the conditions they ran under."""
    lines = ["| attention | n_kv_head | KV cache bytes per token (float32) | parameters |", "|---|---|---|---|"]
    lines += [f"| {r['attention']} | {r['n_kv_head']} | {r['bytes_per_token']:,} | {r['parameters']:,} |" for r in results["kv_cache"]]
    lines += ["", f"| positions ({results['steps']} steps at context 64) | val loss at 64 | val loss at 128 |", "|---|---|---|"]
    for r in results["positions"]:
        double = "no rows past 64" if r["val_loss_128"] is None else f"{r['val_loss_128']:.4f}"
        lines.append(f"| {r['pos']} | {r['val_loss_64']:.4f} | {double} |")
    lines += ["", f"| MLP ({results['steps']} steps) | parameters | val loss | train time (s) | tokens per expert, per block |", "|---|---|---|---|---|"]
    for r in results["experts"]:
        share = "; ".join("/".join(f"{s:.2f}" for s in block) for block in r.get("share_per_expert", [])) or "-"
        lines.append(f"| {r['mlp']} | {r['parameters']:,} | {r['val_loss']:.4f} | {r['train_seconds']:,.0f} | {share} |")
    lines += ["", f"| tokenizer ({results['seconds']:.0f} s of training each) | vocabulary | steps | chars per token | val loss per token | val bits per char |", "|---|---|---|---|---|---|"]
    for r in results["tokenizers"]:
        lines.append(f"| {r['tokenizer']} | {r['vocab_size']:,} | {r['steps']:,} | {r['chars_per_token']:.2f} | {r['val_loss_per_token']:.4f} | {r['val_bits_per_char']:.4f} |")
    # Tables kept from an earlier run (--tables) may come from another day or machine: one line per set of conditions.
    tables_by_conditions = {}
    for table, machine in results.get("machines", {}).items():
        tables_by_conditions.setdefault(conditions_line(machine), []).append(table)
    if len(tables_by_conditions) == 1:
        lines += ["", *tables_by_conditions]
    elif tables_by_conditions:
        lines += ["", " ".join(f"{', '.join(tables)}: {line}" for line, tables in tables_by_conditions.items())]
    return "\n".join(lines)


def options(p):
    p.add_argument("--steps", type=int, default=600, help="training steps per model for the positions and experts tables")
    p.add_argument("--seconds", type=float, default=60.0, help="training time per tokenizer")
    p.add_argument("--data", default=str(TINYSHAKESPEARE))
    p.add_argument("--tables", nargs="*", default=TABLES, choices=TABLES, help="run only these tables; the others are kept from the JSON file's last run")


def measure(args, machine):
    path = Path(args.json)
    text = open(args.data, encoding="utf-8").read()
    chars = CharTokenizer.from_text(text)
    batches = Batches(chars.encode(text, dtype=chars.id_dtype), RECIPE["block_size"])
    kept = json.loads(path.read_text()) if set(args.tables) != set(TABLES) and path.exists() else {}
    if kept and (kept.get("steps"), kept.get("seconds")) != (args.steps, args.seconds):
        raise SystemExit(f"{path} was measured with --steps {kept.get('steps')} --seconds {kept.get('seconds')}: use the same to mix tables")
    results = {**kept, "steps": args.steps, "seconds": args.seconds}
    results.setdefault("machines", {})
    run = {
        "kv_cache": lambda: kv_cache_table(chars.vocab_size),
        "positions": lambda: positions_table(batches, chars.vocab_size, args.steps),
        "experts": lambda: experts_table(batches, chars.vocab_size, args.steps),
        "tokenizers": lambda: tokenizer_table(text, args.seconds),
    }
    for table in args.tables:
        results[table] = run[table]()
        results["machines"][table] = machine
    return results
