"""One file per op (or family of ops): its math, its numpy reference, its kernels, its Function,
and its gradient-check case. The ops the default GPT runs are here; the techniques' ops are in
`electives/`. `microtensor.functional` gathers the public functions of both."""
