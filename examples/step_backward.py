"""A tiny GPT, one forward pass and one backward pass: the script to step through in a debugger.

    NUMBA_DISABLE_JIT=1 python -m pdb examples/step_backward.py

docs/debugging.md is the walk: which lines to break at in LayerNorm's backward kernel and in
attention's, the pdb commands, and what you see there (and .vscode/launch.json does the same from
VS Code). No data file is needed: the tokens are random integers.

NUMBA_DISABLE_JIT=1 makes every kernel an ordinary Python function, which pdb can stop in. Without
it the kernels are compiled to machine code, pdb never sees their lines, and a breakpoint inside
one is silently never hit. The results are the same either way; only the speed changes.
"""
import numba
import numpy as np

import microtensor as mt
from gpt.model.transformer import GPT, GPTConfig


def main():
    if not numba.config.DISABLE_JIT:
        print("note: NUMBA_DISABLE_JIT=1 is not set: the kernels are compiled, and pdb will not stop inside them")
    mt.manual_seed(0)
    # 1 block, 2 heads of 4 dims: every array is small enough to print whole
    config = GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8)
    model = GPT(config)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(2, 6))  # 2 sequences of 6 tokens
    idx, targets = mt.tensor(tokens[:, :-1]), mt.tensor(tokens[:, 1:])  # (B, T) = (2, 5): predict the next token

    logits, loss = model(idx, targets)  # forward: every op records what its backward will need
    print(f"kernels: {mt.get_kernels()}   logits {logits.shape}   loss {loss.item():.4f}")

    loss.backward()  # backward: the engine calls each op's backward, last op first
    for name, param in model.named_parameters():
        if name in ("transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_attn.weight"):
            print(f"{name:36} {param.shape!s:9} gradient norm {np.linalg.norm(param.grad):.4f}")


if __name__ == "__main__":
    main()
