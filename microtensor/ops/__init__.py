"""One file per op (or family of ops): its math, its numpy reference, its kernels, its Function,
and its gradient-check case. `microtensor.functional` gathers the public functions."""
