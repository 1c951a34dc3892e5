"""The fast kernel set: everything in microtensor that exists only for speed.

Each module here gives some readable kernels of `microtensor/ops/` a fast twin (same arguments,
same result, registered with `kernels.fast_twin`); importing this package registers them all.
`mt.set_kernels("fast")` (the default) imports it; the readable set never does. The twins of the
ops the default GPT runs are at the top; those of the techniques (`ops/electives/`) are in
`electives/`.

    blas.py          numpy's BLAS called from compiled kernels, on Numba's threads
    vector_math.py   e^x, tanh, erf, the sigmoid and a row's max, written so that loops vectorize
    memory.py        the copy of a leaf's first gradient into `.grad`, and the sum of two arrays (gradients, Add)
    optimizer.py     SGD's and AdamW's updates, shared among the threads
    process.py       process-wide settings for training speed, applied only when asked for

Some ops have no fast twin, because their readable kernels are already as fast as they need be:
- embedding (ops/embedding.py): a gather and a scatter-add are pure memory traffic, copied and
  added row by row in loops the compiler vectorizes as written.
- the mixture of experts (ops/electives/moe.py): gathering rows, scatter-adding them and
  renormalizing k gates per token are memory traffic; the layer's arithmetic is in the experts'
  matrix products, which have their twins (matmul.py).

What a kernel outside microtensor needs to be fast too (a model's own kernel, such as the one-token
decode step) is here as well: `kernel` (Numba's compiler with microtensor's cache) and the vector
math and GELU's constants below.

Why a fast form exists is said in one sentence beside it; what it gains is measured by the
scripts in bench/ and reported in bench/README.md.
"""
from ..kernels import kernel  # noqa: F401
from ..ops.gelu import CUBIC, SQRT_2_OVER_PI  # noqa: F401  (the tanh form of GELU, for a fused kernel)
from . import attention, cross_entropy, gelu, layer_norm, matmul, memory, optimizer, softmax  # noqa: F401
from .electives import online_attention, quantize, rms_norm, selective_scan, silu  # noqa: F401
from .vector_math import REDUCE_FASTMATH, erf, exp_of_nonpositive, max_of_row, sigmoid, tanh  # noqa: F401
