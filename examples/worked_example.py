"""Attention small enough to check by hand: 2 tokens, 3 dims, one head, causal.

    python examples/worked_example.py

Prints every value of the forward pass (q, k, v, the scores, the 1/√D scaling, the mask, the
probabilities, the output) and every gradient of the backward pass (dO is given; then dP, dS, dq,
dk, dv), each computed here in numpy, one formula per step, exactly as docs/ops/attention.md
derives them. Then it runs microtensor's own attention ops on the same numbers, forward and
backward, with the readable kernels and (when Numba compiles) with the fast ones, and says whether
they agree with the steps above. It exits with status 1 if they do not.

Shapes, for one (batch, head): q, k, v, O, dO, dq, dk, dv (T, D) = (2, 3); S, P, dP, dS (T, T) = (2, 2).
Rows are tokens: row i of q is token i's query. Token 0 may look only at itself, token 1 at both.
"""
import math
import sys

import numba
import numpy as np

import microtensor as mt
import microtensor.functional as F

T, D = 2, 3
q = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])  # (T, D) queries, one row per token
k = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0]])  # (T, D) keys
v = np.array([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]])  # (T, D) values
grad_out = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]])  # (T, D) dO = dL/dO, as if from the layers above


def show(title, array):
    """A title line, then the matrix's rows with 4 decimals (-inf for a masked score)."""
    print(title)
    for row in np.atleast_2d(array):
        print("    [" + "  ".join("    -inf" if x == -np.inf else f"{x:8.4f}" for x in row) + " ]")


def attention_by_hand():
    """Every step of the forward and backward pass in numpy, printed; returns O, dq, dk, dv."""
    print("Attention for one head: T = 2 tokens, D = 3 dims, causal (token 0 sees token 0; token 1 sees 0 and 1)\n")
    show("q  (T, D)  queries", q)
    show("k  (T, D)  keys", k)
    show("v  (T, D)  values", v)

    print("\nForward")
    raw = q @ k.T  # (T, T): raw_ij = q_i · k_j
    show("1. q kᵀ  (T, T)  entry (i, j) = q_i · k_j", raw)
    scale = 1 / math.sqrt(D)
    print(f"2. the scaling: 1/√D = 1/√{D} = {scale:.4f}")
    scores = raw * scale  # (T, T)
    show("   S = q kᵀ / √D  (T, T)", scores)
    visible = np.arange(T)[None, :] <= np.arange(T)[:, None]  # (T, T): key j <= query i
    masked = np.where(visible, scores, -np.inf)
    show("3. masked: S_ij = -inf where key j comes after query i", masked)
    shifted = masked - masked.max(axis=1, keepdims=True)  # e^(-inf) = 0: masked keys get no weight
    exps = np.exp(shifted)
    probs = exps / exps.sum(axis=1, keepdims=True)  # (T, T)
    show("4. P = softmax(S) along each row  (T, T)  (each row sums to 1)", probs)
    out = probs @ v  # (T, D)
    show("5. O = P v  (T, D)  row i = sum_j P_ij v_j", out)

    print("\nBackward")
    show("   dO = dL/dO  (T, D)  given", grad_out)
    d_probs = grad_out @ v.T  # (T, T): dP_ij = dO_i · v_j
    show("6. dP = dO vᵀ  (T, T)  entry (i, j) = dO_i · v_j", d_probs)
    row_dot = (probs * d_probs).sum(axis=1, keepdims=True)  # (T, 1): <P_i, dP_i>
    show("   <P_i, dP_i> = sum_j P_ij dP_ij, one number per row  (T, 1)", row_dot)
    d_scores = probs * (d_probs - row_dot)  # (T, T): the softmax's backward, row by row
    show("7. dS = P * (dP - <P_i, dP_i>)  (T, T)  (0 where masked, since P is 0 there)", d_scores)
    grad_q = d_scores @ k * scale  # (T, D)
    show("8. dq = dS k / √D  (T, D)", grad_q)
    grad_k = d_scores.T @ q * scale  # (T, D)
    show("9. dk = dSᵀ q / √D  (T, D)", grad_k)
    grad_v = probs.T @ grad_out  # (T, D)
    show("10. dv = Pᵀ dO  (T, D)", grad_v)
    return out, grad_q, grad_k, grad_v


def attention_by_microtensor():
    """The same numbers through microtensor's two attention ops; yields (op, O, dq, dk, dv)."""
    as_tensor = lambda a: mt.tensor(a[None, None], dtype=mt.float64, requires_grad=True)  # (1, 1, T, D)
    q_t, k_t, v_t = as_tensor(q), as_tensor(k), as_tensor(v)
    out = F.scaled_dot_product_attention(q_t, k_t, v_t, causal=True)  # (1, 1, T, D)
    out.backward(grad_out[None, None])
    yield "scaled_dot_product_attention", out.numpy()[0, 0], q_t.grad[0, 0], k_t.grad[0, 0], v_t.grad[0, 0]

    # multi_head_attention (what the GPT calls) takes q, k and v side by side: qkv (B, T, 3D)
    qkv = mt.tensor(np.concatenate([q, k, v], axis=1)[None], dtype=mt.float64, requires_grad=True)
    out = F.multi_head_attention(qkv, n_head=1)  # (1, T, D)
    out.backward(grad_out[None])
    grad_q, grad_k, grad_v = np.split(qkv.grad[0], 3, axis=1)
    yield "multi_head_attention", out.numpy()[0], grad_q, grad_k, grad_v


def main():
    expected = attention_by_hand()
    print("\nmicrotensor's ops on the same numbers (float64)")
    kernel_sets = ["readable"] if numba.config.DISABLE_JIT else ["readable", "fast"]
    if numba.config.DISABLE_JIT:
        print("    (NUMBA_DISABLE_JIT=1: the fast kernels need Numba's compiler, so only the readable ones run)")
    all_agree = True
    for kernel_set in kernel_sets:
        with mt.using_kernels(kernel_set):
            for op, *got in attention_by_microtensor():
                difference = max(float(np.max(np.abs(g - e))) for g, e in zip(got, expected))
                agree = all(np.allclose(g, e, rtol=1e-12, atol=1e-12) for g, e in zip(got, expected))
                all_agree &= agree
                verdict = "agree" if agree else "DISAGREE"
                print(f"    {kernel_set:8} kernels, {op:28}: O, dq, dk, dv {verdict} "
                      f"with the steps above (largest difference {difference:.1e})")
    print("\nAll values agree." if all_agree else "\nSome values DISAGREE: see the lines above.")
    return 0 if all_agree else 1


if __name__ == "__main__":
    sys.exit(main())
