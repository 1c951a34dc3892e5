"""Each fused op, forward and forward+backward, at the default recipe's shapes, against PyTorch.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_ops.py [--json FILE]

A row's ratio is PyTorch's median time over microtensor's (above 1: microtensor is faster), on the
same inputs, with blocks of calls alternating between microtensor and PyTorch (which runs in a
process of its own: bench/torch_side.py); its spread is the lowest and highest ratio of the
blocks' medians. Every row runs the fast kernel set but the "matmul readable" rows, which run the
readable one (`mt.using_kernels("readable")`: the plain-loop matmul, forward and backward).
"""
from common import alternate, block_ratios, console, fmt_ratio, fmt_time, machine_info, parser, print_machine, ratio, spread, start_torch, write_json  # isort: skip  (before models: it puts the checkout on sys.path, and tunes the process)
import numpy as np
import torch_gpt
from rich.table import Table

import microtensor as mt
import microtensor.functional as F
from microtensor import optim

V = 65  # the vocabulary of tinyshakespeare


def op_cases():
    """(row name, kind for bench/torch_side.py, input shapes, kernel set, microtensor fn)."""
    cross_entropy_targets = mt.tensor(torch_gpt.integer_inputs(1, V, 768))
    embedding_ids = mt.tensor(torch_gpt.integer_inputs(1, V, (12, 64)))
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


BLOCK = 5  # calls per alternating block


def measure_op(torch_process, repeat, index, case):
    name, kind, shapes, kernels, fn = case
    seed = 100 + index
    inputs = [mt.tensor(a, requires_grad=True) for a in torch_gpt.float_inputs(seed, shapes)]
    with mt.no_grad():
        out_shape = fn(*inputs).shape
    upstream = torch_gpt.float_inputs(seed + 1, [out_shape])[0]

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
    by_block = None
    if remote:
        by_block = spread(block_ratios(times["theirs_forward_backward"], times["forward_backward"], BLOCK))
    return {
        "op": name,
        "kernels": kernels,
        "forward_backward_ratio_spread": by_block,
        "forward_s": medians["forward"],
        "forward_backward_s": medians["forward_backward"],
        "torch_forward_s": medians.get("theirs_forward"),
        "torch_forward_backward_s": medians.get("theirs_forward_backward"),
        "forward_ratio": ratio(medians.get("theirs_forward"), medians["forward"]),
        "forward_backward_ratio": ratio(medians.get("theirs_forward_backward"), medians["forward_backward"]),
    }


def measure_adamw(torch_process, repeat):
    """One AdamW step over the default recipe's parameter shapes."""
    C, L, seed = 128, 4, 7
    shapes = [(V, C), (64, C)] + [(C,), (C, 3 * C), (C, C), (C,), (C, 4 * C), (4 * C, C)] * L + [(C,)]
    params = [mt.nn.Parameter(a) for a in torch_gpt.float_inputs(seed, shapes)]
    for p, g in zip(params, torch_gpt.float_inputs(seed + 1, shapes)):
        p.grad = g
    opt = optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    remote = {}
    if torch_process is not None:
        torch_process.ask(setup="adamw", shapes=shapes, seed=seed, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
        remote = {"theirs": "adamw_step"}
    with mt.using_kernels("fast"):
        times = alternate({"ours": opt.step}, remote, torch_process, repeat, block=BLOCK)
    ours, theirs = float(np.median(times["ours"])), (float(np.median(times["theirs"])) if remote else None)
    return {
        "op": f"AdamW step ({sum(int(np.prod(s)) for s in shapes):,} params)",
        "kernels": "fast",
        "forward_backward_ratio_spread": spread(block_ratios(times["theirs"], times["ours"], BLOCK)) if remote else None,
        "forward_s": None,
        "forward_backward_s": ours,
        "torch_forward_s": None,
        "torch_forward_backward_s": theirs,
        "forward_ratio": None,
        "forward_backward_ratio": ratio(theirs, ours),
    }


def measure(args, repeat):
    torch_process = start_torch(args)
    rows = [measure_op(torch_process, repeat, i, case) for i, case in enumerate(op_cases())]
    rows.append(measure_adamw(torch_process, repeat))
    if torch_process is not None:
        torch_process.close()
    return rows


def print_rows(rows):
    table = Table(title="fused ops, float32 (median; ratio = PyTorch time / microtensor time)")
    for column in ("op", "fwd", "torch fwd", "ratio", "fwd+bwd", "torch fwd+bwd", "ratio", "blocks' ratios"):
        table.add_column(column, justify="left" if column == "op" else "right")
    for r in rows:
        by_block = r["forward_backward_ratio_spread"]
        table.add_row(
            r["op"],
            fmt_time(r["forward_s"]),
            fmt_time(r["torch_forward_s"]),
            fmt_ratio(r["forward_ratio"]),
            fmt_time(r["forward_backward_s"]),
            fmt_time(r["torch_forward_backward_s"]),
            fmt_ratio(r["forward_backward_ratio"]),
            "-" if by_block is None else f"{by_block['min']:.2f}-{by_block['max']:.2f}×",
        )
    console.print(table)


def main():
    args = parser(__doc__.splitlines()[0]).parse_args()
    info = machine_info()
    print_machine(info)
    rows = measure(args, args.repeat or 60)
    print_rows(rows)
    write_json(args.json, {"machine": info, "ops": rows})


if __name__ == "__main__":
    main()
