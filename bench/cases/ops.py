"""Each fused op, forward and forward+backward, at the default recipe's shapes, against PyTorch.

A row's ratio is PyTorch's median time over microtensor's (above 1: microtensor is faster), on the
same inputs, with blocks of calls alternating between microtensor and PyTorch; its spread is the
lowest and highest ratio of the blocks' medians. Every row runs the fast kernel set but the
"matmul readable" rows, which run the readable one (`mt.using_kernels("readable")`: the plain-loop
matmul, forward and backward).
"""
import numpy as np
from harness import alternate, block_ratios, float_inputs, integer_inputs, number, over_blocks, ratio, spread, start_torch, x

import microtensor as mt
import microtensor.functional as F
from microtensor import optim

V = 65  # the vocabulary of tinyshakespeare
BLOCK = 5  # calls per alternating block


def op_cases():
    """(row name, kind for bench/torch_side.py, input shapes, kernel set, microtensor fn)."""
    cross_entropy_targets = mt.tensor(integer_inputs(1, V, 768))
    embedding_ids = mt.tensor(integer_inputs(1, V, (12, 64)))
    return [
        ("matmul fast 768×128 @ 128×512", "matmul", [(768, 128), (128, 512)], "fast", F.matmul),
        ("matmul fast 768×512 @ 512×128", "matmul", [(768, 512), (512, 128)], "fast", F.matmul),
        ("matmul readable 768×128 @ 128×512", "matmul", [(768, 128), (128, 512)], "readable", F.matmul),
        ("matmul readable 768×512 @ 512×128", "matmul", [(768, 512), (512, 128)], "readable", F.matmul),
        ("softmax (12, 4, 64, 64)", "softmax", [(12, 4, 64, 64)], "fast", lambda x: F.softmax(x, dim=-1)),
        ("layer_norm (768, 128)", "layer_norm", [(768, 128), (128,), (128,)], "fast", F.layer_norm),
        ("rms_norm (768, 128)", "rms_norm", [(768, 128), (128,)], "fast", F.rms_norm),
        ("gelu tanh (768, 512)", "gelu_tanh", [(768, 512)], "fast", lambda x: F.gelu(x, approximate="tanh")),
        ("gelu erf (768, 512)", "gelu_erf", [(768, 512)], "fast", lambda x: F.gelu(x, approximate="none")),
        ("silu (768, 512)", "silu", [(768, 512)], "fast", F.silu),
        ("causal attention (12, 4, 64, 32)", "attention", [(12, 4, 64, 32)] * 3, "fast", F.scaled_dot_product_attention),
        ("cross_entropy (768, 65)", "cross_entropy", [(768, V)], "fast", lambda x: F.cross_entropy(x, cross_entropy_targets)),
        ("embedding (12, 64) from (65, 128)", "embedding", [(V, 128)], "fast", lambda w: F.embedding(embedding_ids, w)),
    ]


def measure(args, machine):
    torch_process = start_torch(args)
    repeat = args.repeat or 60
    rows = [measure_op(torch_process, repeat, i, case) for i, case in enumerate(op_cases())]
    rows.append(measure_adamw(torch_process, repeat))
    if torch_process is not None:
        torch_process.close()
    return {"machine": machine, "ops": rows}


def measure_op(torch_process, repeat, index, case):
    name, kind, shapes, kernels, fn = case
    seed = 100 + index
    inputs = [mt.tensor(a, requires_grad=True) for a in float_inputs(seed, shapes)]
    with mt.no_grad():
        out_shape = fn(*inputs).shape
    upstream = float_inputs(seed + 1, [out_shape])[0]

    def forward():
        with mt.no_grad():
            fn(*inputs)

    def forward_backward():
        fn(*inputs).backward(upstream)
        for t in inputs:
            t.grad = None

    remote = {}
    if torch_process is not None:
        torch_process.ask(setup="op", name=name, kind=kind, shapes=shapes, seed=seed)
        remote = {"theirs_forward": f"{name}/forward", "theirs_forward_backward": f"{name}/forward_backward"}
    with mt.using_kernels(kernels):  # forward and backward alike
        times = alternate({"forward": forward, "forward_backward": forward_backward}, remote, torch_process, repeat, block=BLOCK)
    medians = {key: float(np.median(values)) for key, values in times.items()}
    return row(
        name, kernels, medians["forward"], medians["forward_backward"], medians.get("theirs_forward"), medians.get("theirs_forward_backward"),
        spread(block_ratios(times["theirs_forward_backward"], times["forward_backward"], BLOCK)) if remote else None,
    )  # fmt: skip


def measure_adamw(torch_process, repeat):
    """One AdamW step over the default recipe's parameter shapes."""
    C, L, seed = 128, 4, 7
    shapes = [(V, C), (64, C)] + [(C,), (C, 3 * C), (C, C), (C,), (C, 4 * C), (4 * C, C)] * L + [(C,)]
    params = [mt.nn.Parameter(a) for a in float_inputs(seed, shapes)]
    for p, g in zip(params, float_inputs(seed + 1, shapes)):
        p.grad = g
    opt = optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    remote = {}
    if torch_process is not None:
        torch_process.ask(setup="adamw", shapes=shapes, seed=seed, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
        remote = {"theirs": "adamw_step"}
    with mt.using_kernels("fast"):
        times = alternate({"ours": opt.step}, remote, torch_process, repeat, block=BLOCK)
    ours, theirs = float(np.median(times["ours"])), (float(np.median(times["theirs"])) if remote else None)
    name = f"AdamW step ({sum(int(np.prod(s)) for s in shapes):,} params)"
    return row(name, "fast", None, ours, None, theirs, spread(block_ratios(times["theirs"], times["ours"], BLOCK)) if remote else None)


def row(name, kernels, forward, forward_backward, torch_forward, torch_forward_backward, by_block):
    return {
        "op": name, "kernels": kernels, "forward_backward_ratio_spread": by_block,
        "forward_s": forward, "forward_backward_s": forward_backward,
        "torch_forward_s": torch_forward, "torch_forward_backward_s": torch_forward_backward,
        "forward_ratio": ratio(torch_forward, forward), "forward_backward_ratio": ratio(torch_forward_backward, forward_backward),
    }  # fmt: skip


def result_rows(data):
    lines = []
    for r in data["ops"]:
        ours, theirs = r["forward_backward_s"], r["torch_forward_backward_s"]
        lines.append(
            f"| {r['op']}, fwd+bwd (µs) | {ours * 1e6:.0f} | {number(None if theirs is None else theirs * 1e6, '.0f')} | "
            f"{x(r['forward_backward_ratio'])} | {over_blocks(r.get('forward_backward_ratio_spread'))} | ≥ 1× |"
        )
    return lines
