"""Each fused op, forward and forward+backward, at the default recipe's shapes, against PyTorch.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_ops.py [--json FILE]

A row's ratio is PyTorch's median time over microtensor's (above 1: microtensor is faster), both
measured in alternation in this process on the same inputs.
"""
import numpy as np
from common import (
    console,
    fmt_ratio,
    fmt_time,
    interleaved_medians,
    machine_info,
    parser,
    print_machine,
    ratio,
    try_import_torch,
    write_json,
)
from rich.table import Table

import microtensor as mt
import microtensor.functional as F
from microtensor import optim


def _arrays(rng, *shapes):
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def op_cases():
    """(name, shapes, microtensor fn, torch fn): each fn takes tensors of its own library."""
    V = 65
    return [
        ("matmul blas 768×128 @ 128×512", [(768, 128), (128, 512)], F.matmul, lambda t, a, b: a @ b),
        ("matmul blas 768×512 @ 512×128", [(768, 512), (512, 128)], F.matmul, lambda t, a, b: a @ b),
        ("matmul numba 768×128 @ 128×512", [(768, 128), (128, 512)], F.matmul, lambda t, a, b: a @ b),
        ("matmul numba 768×512 @ 512×128", [(768, 512), (512, 128)], F.matmul, lambda t, a, b: a @ b),
        ("softmax (12, 4, 64, 64)", [(12, 4, 64, 64)], lambda x: F.softmax(x, dim=-1), lambda t, x: t.softmax(x, dim=-1)),
        ("layer_norm (768, 128)", [(768, 128), (128,), (128,)], lambda x, w, b: F.layer_norm(x, w, b), lambda t, x, w, b: t.nn.functional.layer_norm(x, (128,), w, b)),
        ("rms_norm (768, 128)", [(768, 128), (128,)], lambda x, w: F.rms_norm(x, w), lambda t, x, w: t.nn.functional.rms_norm(x, (128,), w, eps=1e-5)),
        ("gelu tanh (768, 512)", [(768, 512)], lambda x: F.gelu(x, approximate="tanh"), lambda t, x: t.nn.functional.gelu(x, approximate="tanh")),
        ("gelu erf (768, 512)", [(768, 512)], lambda x: F.gelu(x, approximate="none"), lambda t, x: t.nn.functional.gelu(x)),
        ("silu (768, 512)", [(768, 512)], lambda x: F.silu(x), lambda t, x: t.nn.functional.silu(x)),
        (
            "causal attention (12, 4, 64, 32)",
            [(12, 4, 64, 32)] * 3,
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
            lambda t, q, k, v: t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        ),
        ("cross_entropy (768, 65)", [(768, V)], "cross_entropy", "cross_entropy"),
        ("embedding (12, 64) from (65, 128)", [(V, 128)], "embedding", "embedding"),
    ]


def _special(name, rng):
    """Inputs with integer parts (targets, ids), built per library."""
    if name == "cross_entropy":
        targets = rng.integers(0, 65, 768)
        return (
            lambda x: F.cross_entropy(x, mt.tensor(targets)),
            lambda t, x: t.nn.functional.cross_entropy(x, t.tensor(targets)),
        )
    ids = rng.integers(0, 65, (12, 64))
    return (
        lambda w: F.embedding(mt.tensor(ids), w),
        lambda t, w: t.nn.functional.embedding(t.tensor(ids), w),
    )


def measure(repeat):
    torch = try_import_torch()
    rng = np.random.default_rng(0)
    rows = []
    for name, shapes, ours_fn, theirs_fn in op_cases():
        if isinstance(ours_fn, str):
            ours_fn, theirs_fn = _special(ours_fn, rng)
        mt.set_matmul("numba" if "numba" in name else "blas")  # the backend also serves backward
        arrays = _arrays(rng, *shapes)
        ours_inputs = [mt.tensor(a, requires_grad=True) for a in arrays]
        upstream = None

        def ours_forward():
            with mt.no_grad():
                ours_fn(*ours_inputs)

        def ours_forward_backward():
            nonlocal upstream
            out = ours_fn(*ours_inputs)
            if upstream is None:
                upstream = rng.standard_normal(out.shape).astype(np.float32)
            out.backward(upstream)
            for t in ours_inputs:
                t.grad = None

        fns = {"ours_fwd": ours_forward, "ours_fwdbwd": ours_forward_backward}
        if torch is not None:
            theirs_inputs = [torch.tensor(a, requires_grad=True) for a in arrays]
            out = theirs_fn(torch, *theirs_inputs)
            theirs_upstream = torch.tensor(rng.standard_normal(tuple(out.shape)).astype(np.float32))

            def theirs_forward():
                with torch.no_grad():
                    theirs_fn(torch, *theirs_inputs)

            def theirs_forward_backward():
                out = theirs_fn(torch, *theirs_inputs)
                out.backward(theirs_upstream)
                for t in theirs_inputs:
                    t.grad = None

            fns.update(theirs_fwd=theirs_forward, theirs_fwdbwd=theirs_forward_backward)
        medians = interleaved_medians(fns, repeat=repeat)
        rows.append(
            {
                "op": name,
                "forward_s": medians["ours_fwd"],
                "forward_backward_s": medians["ours_fwdbwd"],
                "torch_forward_s": medians.get("theirs_fwd"),
                "torch_forward_backward_s": medians.get("theirs_fwdbwd"),
                "forward_ratio": ratio(medians.get("theirs_fwd"), medians["ours_fwd"]),
                "forward_backward_ratio": ratio(medians.get("theirs_fwdbwd"), medians["ours_fwdbwd"]),
            }
        )
    mt.set_matmul("blas")
    rows.append(measure_adamw(torch, repeat))
    return rows


def measure_adamw(torch, repeat):
    """One AdamW step over the default recipe's parameter shapes."""
    rng = np.random.default_rng(1)
    C, V, L = 128, 65, 4
    shapes = [(V, C), (64, C)] + [(C,), (C, 3 * C), (C, C), (C,), (C, 4 * C), (4 * C, C)] * L + [(C,)]
    arrays = _arrays(rng, *shapes)
    grads = _arrays(rng, *shapes)
    ours = [mt.nn.Parameter(a.copy()) for a in arrays]
    for p, g in zip(ours, grads):
        p.grad = g
    ours_opt = optim.AdamW(ours, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    fns = {"ours": ours_opt.step}
    if torch is not None:
        theirs = [torch.tensor(a.copy(), requires_grad=True) for a in arrays]
        for p, g in zip(theirs, grads):
            p.grad = torch.tensor(g)
        theirs_opt = torch.optim.AdamW(theirs, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, foreach=True)
        fns["theirs"] = theirs_opt.step
    medians = interleaved_medians(fns, repeat=repeat)
    return {
        "op": f"AdamW step ({sum(a.size for a in arrays):,} params)",
        "forward_s": None,
        "forward_backward_s": medians["ours"],
        "torch_forward_s": None,
        "torch_forward_backward_s": medians.get("theirs"),
        "forward_ratio": None,
        "forward_backward_ratio": ratio(medians.get("theirs"), medians["ours"]),
    }


def print_rows(rows):
    table = Table(title="fused ops, float32 (median; ratio = PyTorch time / microtensor time)")
    for column in ("op", "fwd", "torch fwd", "ratio", "fwd+bwd", "torch fwd+bwd", "ratio"):
        table.add_column(column, justify="left" if column == "op" else "right")
    for r in rows:
        table.add_row(
            r["op"],
            fmt_time(r["forward_s"]),
            fmt_time(r["torch_forward_s"]),
            fmt_ratio(r["forward_ratio"]),
            fmt_time(r["forward_backward_s"]),
            fmt_time(r["torch_forward_backward_s"]),
            fmt_ratio(r["forward_backward_ratio"]),
        )
    console.print(table)


def main():
    args = parser(__doc__.splitlines()[0]).parse_args()
    info = machine_info()
    print_machine(info)
    rows = measure(args.repeat or 60)
    print_rows(rows)
    write_json(args.json, {"machine": info, "ops": rows})


if __name__ == "__main__":
    main()
