"""The fuzz entries of microtensor/ops/electives/online_attention.py (an elective).

How an entry draws its arguments and judges the call: fuzzing.py."""
import numpy as np

import microtensor.functional as F
from fuzzing import attention_check, attention_oracle, fuzz, fuzz_test, run, some_slopes


def a_tile_size(draw):
    tile_size = draw.choice((0, -2, 1.5, True)) if draw.rarely() and draw.boolean() else draw.choice((None, 1, 2, 3, 128, np.int64(2)))
    if tile_size is not None and (not isinstance(tile_size, (int, np.integer)) or isinstance(tile_size, bool) or tile_size < 1):
        draw.mark_invalid(f"tile_size = {tile_size!r}")
    return tile_size


@fuzz("online_attention")
def _online_attention(draw):
    B, Hk, group, Tq, D = draw.integer(0, 2), draw.integer(1, 2), draw.integer(1, 2), draw.integer(0, 3), draw.integer(0 if draw.rarely() else 1, 3)
    H = Hk * group
    Tk = Tq + draw.integer(0, 2)
    causal = draw.flag("causal")
    if draw.one_in(8) and Tq > 0:
        Tk = Tq - 1
        if causal is True:
            draw.mark_invalid("Tk < Tq, causal")
    if draw.one_in(10):
        Hk, H = 2, 3
        draw.mark_invalid("Hk does not divide H")
    dtype = draw.float_dtype()
    q = draw.float_operand((B, H, Tq, D), dtype)
    k = draw.same_dtype_operand((B, Hk, Tk, D), dtype)
    v_shape = (B, Hk, Tk, D)
    if draw.one_in(10):
        v_shape = (B, Hk, Tk, D + 1)
        draw.mark_invalid("v of another shape")
    v = draw.same_dtype_operand(v_shape, dtype)
    if D == 0 or (Tk == 0 and Tq > 0 and B * H > 0):
        draw.mark_invalid("D = 0, or queries without keys")
    slopes, slope_values = some_slopes(draw, H, dtype)
    tile_size = a_tile_size(draw)

    def expect(result):
        qa, ka, va = (t.numpy() for t in (q, k, v))
        ka, va = np.repeat(ka, H // Hk, axis=1), np.repeat(va, H // Hk, axis=1)  # (B, H, Tk, D): head h reads h // (H / Hk)
        out = attention_oracle(qa, ka, va, causal, slope_values).astype(dtype)
        attention_check("online_attention", result, qa, ka, va, out, dtype, draw.kernels, causal)

    run(draw, "online_attention", lambda: F.online_attention(q, k, v, causal, slopes, tile_size), expect)


@fuzz("multi_head_online_attention")
def _multi_head_online_attention(draw):
    B, T, Hk, group, D = draw.integer(0, 2), draw.integer(0, 4), draw.integer(1, 2), draw.integer(1, 2), draw.integer(0 if draw.rarely() else 1, 3)
    H = Hk * group
    dtype = draw.float_dtype()
    qkv = draw.float_operand((B, T, (H + 2 * Hk) * D), dtype)
    n_head = draw.choice((0, -1, float(H), True)) if draw.rarely() and draw.boolean() else H
    if n_head is not H:
        draw.mark_invalid(f"n_head = {n_head!r}")
    n_kv_head = None if Hk == H and draw.boolean() else Hk
    if draw.one_in(10):
        n_kv_head = draw.choice((0, 1.0, H + 1))  # below 1, not an int, or not dividing H
        draw.mark_invalid(f"n_kv_head = {n_kv_head!r}")
    if D == 0:
        draw.mark_invalid("D = 0")
    if draw.one_in(15):
        qkv = draw.tensor((B, T), requires_grad=False)
        draw.mark_invalid("a 2-d qkv")
    causal = draw.flag("causal")
    slopes, slope_values = some_slopes(draw, H, dtype)
    tile_size = a_tile_size(draw)

    def expect(result):
        values = qkv.numpy()
        kv = H if n_kv_head is None else n_kv_head
        d = values.shape[-1] // (H + 2 * kv)
        q = values[..., : H * d].reshape(B, T, H, d).transpose(0, 2, 1, 3)  # (B, H, T, d)
        k = values[..., H * d : (H + kv) * d].reshape(B, T, kv, d).transpose(0, 2, 1, 3)  # (B, Hk, T, d)
        v = values[..., (H + kv) * d :].reshape(B, T, kv, d).transpose(0, 2, 1, 3)
        k, v = np.repeat(k, H // kv, axis=1), np.repeat(v, H // kv, axis=1)  # (B, H, T, d)
        out = attention_oracle(q, k, v, causal, slope_values).transpose(0, 2, 1, 3).reshape(B, T, H * d)
        attention_check("multi_head_online_attention", result, q, k, v, out.astype(dtype), dtype, draw.kernels, causal)

    run(draw, "multi_head_online_attention", lambda: F.multi_head_online_attention(qkv, n_head, causal, n_kv_head, slopes, tile_size), expect)


test_fuzz = fuzz_test(__name__)
