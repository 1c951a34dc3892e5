"""The fuzz entries of microtensor/ops/attention.py: multi-head and scaled dot-product
attention, ALiBi's slopes.

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from fuzzing import alibi_oracle, attention_check, attention_oracle, fuzz, fuzz_test, run


@fuzz("multi_head_attention")
def _multi_head_attention(draw):
    B, T, H, D = draw.integer(0, 2), draw.integer(0, 4), draw.integer(1, 3), draw.integer(0 if draw.rarely() else 1, 3)
    qkv = draw.float_operand((B, T, 3 * H * D), draw.float_dtype())
    n_head = draw.choice((0, -1, H + 1, float(H), True)) if draw.rarely() else H
    if n_head is True or isinstance(n_head, float) or n_head < 1:
        draw.mark_invalid(f"n_head = {n_head!r}")
    elif draw.valid and (H * D) % n_head:
        draw.mark_invalid("n_head does not divide C")
    if D == 0:
        draw.mark_invalid("C = 0")
    if draw.one_in(15):
        qkv = draw.tensor((B, T), requires_grad=False)
        draw.mark_invalid("a 2-d qkv")
    causal = draw.flag("causal")

    def expect(result):
        values = qkv.numpy()
        C = values.shape[-1] // 3
        heads = values.reshape(B, T, 3, n_head, C // n_head).transpose(2, 0, 3, 1, 4)
        out = attention_oracle(heads[0], heads[1], heads[2], causal).transpose(0, 2, 1, 3).reshape(B, T, C)
        attention_check("multi_head_attention", result, heads[0], heads[1], heads[2], out.astype(values.dtype), values.dtype, draw.kernels, causal)

    run(draw, "multi_head_attention", lambda: F.multi_head_attention(qkv, n_head, causal), expect)


@fuzz("scaled_dot_product_attention")
def _scaled_dot_product_attention(draw):
    B, H, Tq, D = draw.integer(0, 2), draw.integer(0, 2), draw.integer(0, 3), draw.integer(0 if draw.rarely() else 1, 3)
    Tk = Tq + draw.integer(0, 2)
    causal = draw.flag("causal")
    if draw.one_in(8) and Tq > 0:
        Tk = Tq - 1
        if causal is True:
            draw.mark_invalid("Tk < Tq, causal")
    dtype = draw.float_dtype()
    q = draw.float_operand((B, H, Tq, D), dtype)
    k = draw.same_dtype_operand((B, H, Tk, D), dtype)
    v_shape = (B, H, Tk, D)
    if draw.one_in(10):
        v_shape = (B, H, Tk, D + 1)
        draw.mark_invalid("v of another shape")
    v = draw.same_dtype_operand(v_shape, dtype)
    if D == 0 or (Tk == 0 and Tq > 0 and B * H > 0):
        draw.mark_invalid("D = 0, or queries without keys")

    def expect(result):
        arrays = [t.numpy() for t in (q, k, v)]
        out = attention_oracle(*arrays, causal).astype(dtype)
        attention_check("scaled_dot_product_attention", result, *arrays, out, dtype, draw.kernels, causal)

    run(draw, "scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, k, v, causal), expect)


@fuzz("alibi_slopes")
def _alibi_slopes(draw):
    n = draw.choice((0, -1, 2.0, True, "4", None, 2**16 + 1, 10**12)) if draw.rarely() else draw.choice((1, 2, 3, 4, 5, 6, 8, 12, 16, np.int64(7)))
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not 1 <= n <= 2**16:
        draw.mark_invalid(f"n_head = {n!r}")

    def expect(result):
        assert isinstance(result, np.ndarray) and result.dtype == np.float64, f"alibi_slopes: {type(result).__name__} {getattr(result, 'dtype', None)}"
        np.testing.assert_allclose(result, alibi_oracle(int(n)), rtol=1e-14, atol=0, err_msg="alibi_slopes")

    run(draw, "alibi_slopes", lambda: F.alibi_slopes(n), expect)


test_fuzz = fuzz_test(__name__)
