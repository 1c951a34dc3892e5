"""Multi-head latent attention against multi-head, grouped-query and multi-query attention: the KV
cache's bytes per token, and val loss at equal steps on tinyshakespeare.

    python bench/run.py latent_attention [--steps 200] [--kv-latent 32]

Every model has the default recipe's shape (4 layers, 4 heads, 128 wide, block 64, batch 12, AdamW
at 1e-3 with the cosine schedule of bench/cases/electives/variants.py) and trains on the same batches
from the same seed for --steps steps; its val loss is the mean over 40 val batches of 64 tokens. The
bytes per token are those of the cache generation allocates (counted from its arrays, and checked
against GPT.kv_cache_bytes_per_token). Learned positions, but for the last two rows: multi-head
attention with rotary positions, and the latent with the shared rotary key (16 numbers per layer)
that rotary positions need, to be compared with each other.
"""
from harness import TINYSHAKESPEARE, conditions_line

from cases.electives.variants import RECIPE, train, val_loss
from gpt.text.data import Batches, CharTokenizer
from gpt.model.transformer import GPT, GPTConfig


def cache_bytes_per_token(model):
    """Bytes generation's cache allocates per position, from its arrays."""
    arrays = model.new_cache_arrays(1)
    if arrays is None:  # latent attention: each layer's latents and rotary keys
        arrays = [a for cache in model.new_caches(1) for a in (cache.latent, cache.rope_key)]
    total = sum(a.nbytes for a in arrays) // model.config.block_size
    assert total == model.kv_cache_bytes_per_token()
    return total


def variants(kv_latent):
    """(name, options) of each row."""
    return [
        ("multi-head (MHA)", {}),
        ("grouped-query (GQA, 2 key/value heads)", {"n_kv_head": 2}),
        ("multi-query (MQA, 1 key/value head)", {"n_kv_head": 1}),
        (f"latent (MLA, d_c {kv_latent})", {"attention": "latent", "kv_latent": kv_latent}),
        (f"latent (MLA, d_c {kv_latent // 2})", {"attention": "latent", "kv_latent": kv_latent // 2}),
        ("multi-head (MHA), rotary positions", {"pos": "rope"}),
        (f"latent (MLA, d_c {kv_latent}), rotary key", {"attention": "latent", "kv_latent": kv_latent, "pos": "rope"}),
    ]


def options(p):
    p.add_argument("--steps", type=int, default=200, help="training steps of each model")
    p.add_argument("--kv-latent", type=int, default=32, help="the latent's size d_c (half of it is measured too)")
    p.add_argument("--data", default=str(TINYSHAKESPEARE))


def measure(args, machine):
    text = open(args.data, encoding="utf-8").read()
    chars = CharTokenizer.from_text(text)
    batches = Batches(chars.encode(text, dtype=chars.id_dtype), RECIPE["block_size"])
    rows = []
    for name, settings in variants(args.kv_latent):
        config = GPTConfig(vocab_size=chars.vocab_size, **RECIPE, **settings)
        model, steps = train(config, batches, steps=args.steps)
        rows.append({
            "attention": name, "options": settings, "bytes_per_token": cache_bytes_per_token(model),
            "parameters": model.num_parameters(), "steps": steps, "val_loss": val_loss(model, batches, RECIPE["block_size"]),
        })  # fmt: skip
        print(rows[-1], flush=True)
    return {"machine": machine, "steps": args.steps, "rows": rows}


def markdown(data):
    """The table of a run's JSON (the dict measure() returns), and the conditions it ran under."""
    base = data["rows"][0]["bytes_per_token"]
    lines = [
        f"| attention | KV cache bytes per token (float32, 4 layers) | of MHA's | parameters | val loss after {data['steps']} steps |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        lines.append(f"| {r['attention']} | {r['bytes_per_token']:,} | {r['bytes_per_token'] / base:.3f} | {r['parameters']:,} | {r['val_loss']:.4f} |")
    lines += ["", conditions_line(data["machine"])]
    return "\n".join(lines)
