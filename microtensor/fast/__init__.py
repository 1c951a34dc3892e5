"""The fast kernel set: everything in microtensor that exists only for speed.

Each module here gives some readable kernels of `microtensor/ops/` a fast twin (same arguments,
same result, registered with `kernels.fast_twin`); importing this package registers them all.
`mt.set_kernels("fast")` (the default) imports it; the readable set never does.

    blas.py          numpy's BLAS called from compiled kernels, on Numba's threads
    vector_math.py   e^x, tanh, erf, the sigmoid and a row's max, written so that loops vectorize
    memory.py        the copy of a leaf's first gradient into `.grad`
    process.py       process-wide settings for training speed, applied only when asked for

Why a fast form exists is said in one sentence beside it; what it gains is measured by the
scripts in bench/ and reported in bench/README.md.
"""
from . import (  # noqa: F401
    attention, cross_entropy, embedding, gelu, layer_norm, matmul, memory, moe, online_attention, optim, quantize,
    rms_norm, silu, softmax,
)
