"""Weight quantization for inference: a weight matrix kept as small integers and a few float scales,
and the product x @ Ŵ computed from them directly (dequantized on the fly, never stored as floats).

Symmetric absmax quantization, per output channel. W (K, M) is a Linear's weight (row-vector
convention: y = x W, so column c of W makes output c). With q_max = 2^(b-1) - 1 (127 for b = 8
bits, 7 for b = 4):

    s_c    = max_i |W_ic| / q_max                       (M,)     one scale per output channel c
    q_ic   = round(W_ic / s_c), clipped to [-q_max, q_max]   (K, M)   small integers
    Ŵ_ic   = s_c q_ic                                   (K, M)   what the model computes with

An all-zero column has s_c = 0: its q_ic are defined as 0 (no division by zero) and Ŵ_ic = 0 = W_ic
exactly. "Symmetric": the integers are centred on 0 with no offset, so 0 stays exactly 0 and the
product needs no correction term; the code -q_max - 1 (-128, or -8 for int4) is left unused, so that
+x and -x always get codes of the same size.

The error bound. |W_ic / s_c| <= max_i |W_ic| / s_c = q_max, so W_ic / s_c already lies in
[-q_max, q_max] and the clip never changes it (it is written down only to state the range).
Rounding to the nearest integer moves a number by at most 1/2: |W_ic / s_c - q_ic| <= 1/2.
Multiplying by s_c >= 0:

    |W_ic - Ŵ_ic| <= s_c / 2                                     for every i, c

and for an output y = x W (x (K,), one row), the errors of its K terms add up at worst:

    |y_c - ŷ_c| = |sum_i x_i (W_ic - Ŵ_ic)| <= sum_i |x_i| |W_ic - Ŵ_ic| <= (s_c / 2) sum_i |x_i|

(both checked by tests/test_quantize.py). In the code, the quotient W_ic / s_c is taken in float64
after s_c has been rounded to the weight's dtype (the scale that is stored), so the bound holds for
the stored s_c, not for an unrounded one.

Why per output channel. A scale per column can be taken out of the dot product that makes output c,

    ŷ_c = sum_i x_i s_c q_ic = s_c (sum_i x_i q_ic)

so the kernel adds plain products x_i q_ic and multiplies by s_c once per output. One scale for the
whole tensor (per tensor) would be as cheap, but one large weight anywhere would then set a coarse
step for every column; a scale per input row i would have to multiply inside the sum, once per term.

int4: group-wise scales. With 4 bits there are only 15 levels, -7 .. 7, and one outlier in a column
of K weights makes the step coarse for all K. So consecutive rows are cut into groups of G (the last
group may be shorter), and each group of each column gets a scale of its own:

    s_gc = max_{i in group g} |W_ic| / 7                (ceil(K/G), M)
    q_ic = round(W_ic / s_gc),   Ŵ_ic = s_gc q_ic        for i in group g
    ŷ_c  = sum_g s_gc (sum_{i in g} x_i q_ic)           one multiply by a scale per group

The bound holds group by group: |W_ic - Ŵ_ic| <= s_gc / 2, so |y_c - ŷ_c| <= sum_g (s_gc / 2)
sum_{i in g} |x_i|. A group of G = K is per-channel int4. The price of groups: ceil(K/G) scales per
column instead of one (a float each), and K/G multiplies by a scale per output instead of one.

Packing two int4 codes in a byte. The codes of rows 2r and 2r + 1 of a column share byte r: each
is stored as its offset form q + 8 (1 .. 15 for the codes -7 .. 7), row 2r in the low four bits
and row 2r + 1 in the high four:

    byte = (q_{2r} + 8) | ((q_{2r+1} + 8) << 4)          q_k = ((byte >> (4 (k mod 2))) & 15) - 8

An odd K's last byte holds a 0 (stored 8) in its high bits. The offset form is chosen over 4-bit
two's complement because it unpacks with a shift, a mask and a subtraction, without sign extension.
The pairs run along K (the summed axis), so one byte row of W unpacks into two rows of codes, and
the kernels' inner loops run along M as for int8.

Two layouts. A Linear's weight is stored as W itself, (K, M) ("in_out", rows = inputs). A GPT's
token embedding E (V, C) is both a table whose rows are looked up and, tied, the output head
logits = x Eᵀ, that is W = Eᵀ with K = C and M = V. It is stored as E, ("out_in", rows = output
channels), so one scale per output channel is one scale per row of the table: a looked-up row needs
only its own scale(s), and the head reads the same codes through kernels written for that layout
(dot products along the rows), without ever making a float table. For int4 its groups run along
the row.

    layout   bits   values                      scale
    in_out   8      int8  (K, M)                (M,)
    in_out   4      uint8 (ceil(K/2), M)        (ceil(K/G), M)
    out_in   8      int8  (M, K)                (M,)
    out_in   4      uint8 (M, ceil(K/2))        (M, ceil(K/G))

The kernels (readable: plain loops that follow the sums above; fast twins in
microtensor/fast/electives/quantize.py):

    quantize_groups(w, group_size, q_max, q, scale)         q, scale from w (K, M), groups of G rows
    int8_matmul(x, q, scale, out)                           out[n, m] = scale[m] sum_k x[n, k] q[k, m]
    int4_matmul(x, packed, scale, group_size, out)          out[n, m] = sum_g scale[g, m] sum_{k in g} x[n, k] q[k, m]
    int8_matmul_transposed(x, q_t, scale, out)              the same with q stored as q_t (M, K)
    int4_matmul_transposed(x, packed_t, scale_t, group_size, out)
    int8_rows(ids, q_t, scale, out), int4_rows(...)         dequantized rows of an out_in table (a lookup)

Inference only. There is no Function here, so nothing records a graph: `quantized_matmul` refuses
an input that requires a gradient while gradients are on, and is meant to run under `mt.no_grad()`
(as generation and evaluation do). Rounding has no useful derivative; fine-tuning a quantized model
would need a float copy of the weights, which is what quantization removes.
"""
import math

import numpy as np
from numba import prange

from ... import autograd
from ...checks import FLOAT_DTYPES, check_float, check_int, check_tensor, describe
from ...errors import InputError, InputTypeError
from ...kernels import active, kernel
from ...tensor import Tensor

BITS = (4, 8)
Q_MAX = {8: 127, 4: 7}  # 2^(bits-1) - 1: symmetric codes -q_max .. q_max
DEFAULT_GROUP_SIZE = 32  # int4: rows per scale (a float scale per 32 weights: 1 bit per weight)
LAYOUTS = ("in_out", "out_in")

# --------------------------------------------------------------------------------- numpy references


def quantize_reference(w, bits, group_size=None):
    """w (K, M) float -> (q (K, M) int8 codes, unpacked; scale (ceil(K/G), M)), in plain numpy.
    group_size None: one group of all K rows (per channel)."""
    K, M = w.shape
    G = K if group_size is None else group_size
    groups = math.ceil(K / G)
    q = np.zeros((K, M), dtype=np.int8)
    scale = np.zeros((groups, M), dtype=w.dtype)
    for g in range(groups):
        rows = slice(g * G, min(K, (g + 1) * G))
        s = (np.abs(w[rows]).max(axis=0) / w.dtype.type(Q_MAX[bits])).astype(w.dtype)  # (M,)
        safe = np.where(s == 0, 1, s).astype(np.float64)
        codes = np.clip(np.rint(w[rows].astype(np.float64) / safe), -Q_MAX[bits], Q_MAX[bits])
        q[rows] = np.where(s == 0, 0, codes)
        scale[g] = s
    return q, scale


def dequantize_reference(q, scale, group_size=None):
    """Ŵ (K, M) float64 = s_gc q_ic from unpacked codes q (K, M) and scale (ceil(K/G), M)."""
    K = q.shape[0]
    G = K if group_size is None else group_size
    row_scale = np.repeat(scale.astype(np.float64), G, axis=0)[:K]  # (K, M): each row's group scale
    return row_scale * q


def pack_int4(q):
    """q (K, M) int codes in [-7, 7] -> (ceil(K/2), M) uint8: byte [r, m] holds q[2r, m] + 8 in its
    low four bits and q[2r + 1, m] + 8 in its high four (an odd K's missing last row is the code 0)."""
    K, M = q.shape
    offset = np.full((K + K % 2, M), 8, dtype=np.uint8)  # 8 is the code 0
    offset[:K] = q.astype(np.int16) + 8  # 1 .. 15
    return offset[0::2] | (offset[1::2] << 4)


def unpack_int4(packed, K):
    """The inverse of pack_int4: (ceil(K/2), M) uint8 -> (K, M) int8 codes."""
    codes = np.empty((2 * packed.shape[0], packed.shape[1]), dtype=np.int8)
    codes[0::2] = (packed & 15).astype(np.int16) - 8
    codes[1::2] = (packed >> 4).astype(np.int16) - 8
    return codes[:K]


# --------------------------------------------------------------------------------- readable kernels


@kernel
def quantize_groups(w, group_size, q_max, q, scale):
    """w (K, M) -> q (K, M) int8 codes and scale (ceil(K/G), M), G = group_size; group g of column m
    is rows g G .. min(K, (g + 1) G) - 1. s = max |w| / q_max in w's dtype (the scale stored), then
    q = round(w / s), the quotient in float64; s = 0 (an all-zero group) gives q = 0."""
    K, M = w.shape
    zero = w.dtype.type(0)
    for g in range(scale.shape[0]):
        start, stop = g * group_size, min(K, (g + 1) * group_size)
        for m in range(M):
            largest = zero
            for k in range(start, stop):
                largest = max(largest, abs(w[k, m]))
            s = largest / w.dtype.type(q_max)
            scale[g, m] = s
            for k in range(start, stop):
                if s == zero:  # an all-zero group: codes 0, and no division by zero
                    q[k, m] = 0
                else:
                    code = np.rint(np.float64(w[k, m]) / np.float64(s))  # |code| <= q_max: the clip never acts
                    q[k, m] = min(max(code, np.float64(-q_max)), np.float64(q_max))


@kernel(parallel=True)
def int8_matmul(x, q, scale, out):
    """out (N, M) = x (N, K) @ Ŵ, Ŵ = q (K, M) int8 times scale (M,) per column:

        out[n, m] = scale[m] * sum_k x[n, k] q[k, m]

    Loop order n, k, m as in matmul_forward: row k of q is added, times x[n, k], into row n of out
    (an int8 times a float is a float of x's dtype); the scale multiplies once per output, at the
    end. Rows n are independent, so they run in parallel."""
    N, K = x.shape
    M = q.shape[1]
    for n in prange(N):
        for m in range(M):
            out[n, m] = 0
        for k in range(K):
            x_nk = x[n, k]
            for m in range(M):
                out[n, m] += x_nk * q[k, m]
        for m in range(M):
            out[n, m] *= scale[m]


@kernel(parallel=True)
def int4_matmul(x, packed, scale, group_size, out):
    """out (N, M) = x (N, K) @ Ŵ with int4 codes packed two per byte, packed (ceil(K/2), M), and a
    scale per group of group_size rows, scale (ceil(K/G), M):

        out[n, m] = sum_g scale[g, m] * sum_{k in group g} x[n, k] q[k, m]
        q[k, m]   = ((packed[k // 2, m] >> 4 (k mod 2)) & 15) - 8

    Each group's sum is gathered in `partial` (M,), then added to out times the group's scale."""
    N, K = x.shape
    M = out.shape[1]
    for n in prange(N):
        partial = np.empty(M, dtype=x.dtype)  # (M,) the current group's sums, before its scale
        for m in range(M):
            out[n, m] = 0
        for g in range(scale.shape[0]):
            for m in range(M):
                partial[m] = 0
            for k in range(g * group_size, min(K, (g + 1) * group_size)):
                x_nk = x[n, k]
                shift = 4 * (k % 2)  # row 2r in the low four bits, row 2r + 1 in the high four
                for m in range(M):
                    code = int((packed[k // 2, m] >> shift) & 15) - 8  # int(): a uint8 minus 8 would wrap around
                    partial[m] += x_nk * x.dtype.type(code)
            for m in range(M):
                out[n, m] += scale[g, m] * partial[m]


@kernel(parallel=True)
def int8_matmul_transposed(x, q_t, scale, out):
    """out (N, M) = x (N, K) @ Ŵ with Ŵ stored transposed, q_t (M, K) int8 (an embedding table used
    as the output head: logits = x Eᵀ), scale (M,) per row of q_t:

        out[n, m] = scale[m] * sum_k x[n, k] q_t[m, k]

    Each output is a dot product of row n of x with row m of q_t, both read along their rows."""
    N, K = x.shape
    M = q_t.shape[0]
    zero = x.dtype.type(0)
    for n in prange(N):
        for m in range(M):
            total = zero
            for k in range(K):
                total += x[n, k] * q_t[m, k]
            out[n, m] = scale[m] * total


@kernel(parallel=True)
def int4_matmul_transposed(x, packed_t, scale_t, group_size, out):
    """out (N, M) = x (N, K) @ Ŵ with Ŵ stored transposed and packed, packed_t (M, ceil(K/2)), and a
    scale per group of group_size entries of each row, scale_t (M, ceil(K/G)):

        out[n, m] = sum_g scale_t[m, g] * sum_{k in group g} x[n, k] q[m, k]
        q[m, k]   = ((packed_t[m, k // 2] >> 4 (k mod 2)) & 15) - 8"""
    N, K = x.shape
    M = packed_t.shape[0]
    zero = x.dtype.type(0)
    for n in prange(N):
        for m in range(M):
            total = zero
            for g in range(scale_t.shape[1]):
                partial = zero
                for k in range(g * group_size, min(K, (g + 1) * group_size)):
                    code = int((packed_t[m, k // 2] >> (4 * (k % 2))) & 15) - 8
                    partial += x[n, k] * x.dtype.type(code)
                total += scale_t[m, g] * partial
            out[n, m] = total


@kernel
def int8_rows(ids, q_t, scale, out):
    """An embedding lookup from an int8 table: out[n, c] = scale[v] * q_t[v, c], v = ids[n]
    (ids (N,), q_t (V, C), scale (V,), out (N, C)). Only the looked-up rows are dequantized."""
    N, C = out.shape
    for n in range(N):
        v = ids[n]
        for c in range(C):
            out[n, c] = scale[v] * q_t[v, c]


@kernel
def int4_rows(ids, packed_t, scale_t, group_size, out):
    """An embedding lookup from an int4 table: out[n, c] = scale_t[v, c // G] * q[v, c], v = ids[n],
    q[v, c] = ((packed_t[v, c // 2] >> 4 (c mod 2)) & 15) - 8 (packed_t (V, ceil(C/2)), scale_t
    (V, ceil(C/G)), out (N, C))."""
    N, C = out.shape
    for n in range(N):
        v = ids[n]
        for c in range(C):
            code = int((packed_t[v, c // 2] >> (4 * (c % 2))) & 15) - 8
            out[n, c] = scale_t[v, c // group_size] * out.dtype.type(code)


# --------------------------------------------------------------------------------- the quantized matrix


def _check_bits(where, bits):
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)):
        raise InputTypeError(f"{where}: bits must be the int 4 or 8, got {type(bits).__name__} {bits!r}")
    if bits not in BITS:
        raise InputError(f"{where}: bits must be 4 or 8 (int4 or int8 codes), got {bits}")
    return int(bits)


def _check_group_size(where, bits, group_size):
    """int8 is per channel (group_size None); int4 takes a group size >= 1 (None: DEFAULT_GROUP_SIZE)."""
    if bits == 8:
        if group_size is not None:
            raise InputError(f"{where}: group_size applies to bits=4 only (int8 has one scale per output channel), got {group_size!r}")
        return None
    return DEFAULT_GROUP_SIZE if group_size is None else check_int(where, "group_size", group_size, low=1)


def _check_layout(where, layout):
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise InputError(f"{where}: layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


class QuantizedMatrix:
    """A matrix W (K, M), used as x @ W, kept as integer codes and float scales (the table in the
    module docstring gives each array's shape for each layout and bit width).

    values: int8 codes (bits 8) or uint8 bytes of two int4 codes (bits 4); scale: float32 or
    float64, finite and >= 0, whose dtype is the dtype of the products; shape: (K, M); group_size:
    rows per scale for int4 (None for int8); layout: "in_out" (values hold W) or "out_in" (values
    hold Wᵀ, an embedding table's rows). Everything is checked here, so the kernels may index
    without checks. `quantize` makes one from a float matrix."""

    def __init__(self, values, scale, bits, shape, group_size=None, layout="in_out"):
        where = "QuantizedMatrix"
        self.bits = bits = _check_bits(where, bits)
        self.layout = layout = _check_layout(where, layout)
        if bits == 4 and group_size is None:
            raise InputError(f"{where}: bits=4 needs a group_size (rows per scale), got None")
        self.group_size = _check_group_size(where, bits, group_size)
        def is_size(d):
            return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and d >= 1

        if not (isinstance(shape, tuple) and len(shape) == 2 and all(is_size(d) for d in shape)):
            raise InputError(f"{where}: shape must be (K, M), two ints >= 1, got {shape!r}")
        self.shape = K, M = int(shape[0]), int(shape[1])
        if not isinstance(values, np.ndarray) or not isinstance(scale, np.ndarray):
            raise InputTypeError(f"{where}: values and scale must be numpy arrays, got {describe(values)} and {describe(scale)}")
        code_dtype = np.int8 if bits == 8 else np.uint8
        if values.dtype != code_dtype:
            what = "int8 codes" if bits == 8 else "uint8 bytes, two int4 codes each"
            raise InputTypeError(f"{where}: bits={bits} needs values of {what}, got {values.dtype}")
        stored_K = K if bits == 8 else (K + 1) // 2
        groups = 1 if bits == 8 else math.ceil(K / self.group_size)
        if layout == "in_out":
            values_shape, scale_shape = (stored_K, M), ((M,) if bits == 8 else (groups, M))
        else:
            values_shape, scale_shape = (M, stored_K), ((M,) if bits == 8 else (M, groups))
        if values.shape != values_shape:
            raise InputError(f"{where}: bits={bits}, layout {layout!r}, shape {self.shape}: values must have shape {values_shape}, got {values.shape}")
        if scale.dtype not in FLOAT_DTYPES:
            raise InputTypeError(f"{where}: scale must be float32 or float64, got {scale.dtype}")
        if scale.shape != scale_shape:
            raise InputError(f"{where}: bits={bits}, layout {layout!r}, shape {self.shape}: scale must have shape {scale_shape}, got {scale.shape}")
        if not np.all(np.isfinite(scale)) or np.any(scale < 0):
            raise InputError(f"{where}: every scale must be finite and >= 0")
        q_max = Q_MAX[bits]
        codes = values if bits == 8 else np.stack([(values & 15), (values >> 4)]).astype(np.int16) - 8
        if codes.size and (codes.min() < -q_max or codes.max() > q_max):
            raise InputError(f"{where}: bits={bits} codes must lie in [-{q_max}, {q_max}], found {int(codes.min())} .. {int(codes.max())}")
        self.values = np.ascontiguousarray(values)
        self.scale = np.ascontiguousarray(scale)

    @property
    def dtype(self):
        """The float dtype of the scales, and so of every product computed with this matrix."""
        return self.scale.dtype

    @property
    def nbytes(self):
        """Bytes of storage: the codes plus the scales."""
        return self.values.nbytes + self.scale.nbytes

    def codes(self):
        """The integer codes q as (K, M) int8, whatever the layout and packing (a new array)."""
        K = self.shape[0]
        if self.bits == 8:
            return (self.values if self.layout == "in_out" else self.values.T).copy()
        if self.layout == "in_out":
            return unpack_int4(self.values, K)
        return unpack_int4(np.ascontiguousarray(self.values.T), K)

    def row_scales(self):
        """Each code's scale as (K, M), in the scales' dtype (a new array)."""
        K, M = self.shape
        if self.bits == 8:
            return np.broadcast_to(self.scale, (K, M)).copy()
        per_group = self.scale if self.layout == "in_out" else self.scale.T  # (ceil(K/G), M)
        return np.repeat(per_group, self.group_size, axis=0)[:K]

    def dequantize(self):
        """Ŵ (K, M) = scale * q as a float array of the scales' dtype. For inspection and checks
        only: the kernels never make it."""
        return self.row_scales() * self.codes().astype(self.dtype)

    def __repr__(self):
        group = "" if self.group_size is None else f", group_size={self.group_size}"
        return f"QuantizedMatrix(shape={self.shape}, bits={self.bits}{group}, layout={self.layout!r}, dtype={self.dtype})"


def quantize(weight, bits=8, group_size=None, layout="in_out"):
    """A float matrix as a QuantizedMatrix of `bits` (8: per output channel; 4: groups of
    group_size rows, DEFAULT_GROUP_SIZE when None).

    weight: a Tensor or a numpy array, float32 or float64, 2-D and finite; with layout "in_out" it
    is W (K, M) itself (a Linear's weight), with "out_in" it is Wᵀ (M, K) (an embedding table,
    whose rows are the output channels). The scales take weight's dtype."""
    where = "quantize"
    bits = _check_bits(where, bits)
    group_size = _check_group_size(where, bits, group_size)
    layout = _check_layout(where, layout)
    array = weight.data if isinstance(weight, Tensor) else weight
    if not isinstance(array, np.ndarray):
        raise InputTypeError(f"{where}: weight must be a Tensor or a numpy array, got {describe(weight)}")
    if array.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"{where}: weight must be float32 or float64, got {array.dtype}")
    if array.ndim != 2 or 0 in array.shape:
        raise InputError(f"{where}: weight must be a non-empty 2-D matrix, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise InputError(f"{where}: weight holds an inf or a nan; only finite weights can be scaled")
    w = array if layout == "in_out" else array.T  # (K, M) either way (a view)
    K, M = w.shape
    G = K if bits == 8 else group_size
    codes = np.empty((K, M), dtype=np.int8)
    scale = np.empty((math.ceil(K / G), M), dtype=array.dtype)
    quantize_groups(w, G, Q_MAX[bits], codes, scale)  # run once per weight: no fast twin
    if bits == 8:
        values, scale = codes, scale.reshape(M)
    else:
        values = pack_int4(codes)  # (ceil(K/2), M)
    if layout == "out_in":
        values = values.T
        scale = scale if bits == 8 else scale.T
    return QuantizedMatrix(np.ascontiguousarray(values), np.ascontiguousarray(scale), bits, (K, M), group_size, layout)


# --------------------------------------------------------------------------------- the products


def _refuse_gradient(where, x):
    if autograd.is_grad_enabled() and x.requires_grad:
        raise InputError(
            f"{where}: x requires a gradient, but quantized weights are for inference only (there is no "
            "backward through rounding); run it under mt.no_grad(), or use the float model to train"
        )


def quantized_matmul(x, w):
    """x (..., K) @ Ŵ (K, M) -> (..., M), a Tensor outside the graph, computed from w's codes and
    scales (w a QuantizedMatrix) by the kernel for its bits and layout. x: a float Tensor of w's
    dtype. Inference only: an x that requires a gradient is refused while gradients are on."""
    where = "quantized_matmul"
    check_tensor(where, x, "x")
    if not isinstance(w, QuantizedMatrix):
        raise InputTypeError(f"{where}: w must be a QuantizedMatrix (from quantize), got {describe(w)}")
    check_float(where, x)
    K, M = w.shape
    if x.ndim == 0 or x.shape[-1] != K:
        raise InputError(f"{where}: x must have last dim K = {K} (w is {w.shape}), got shape {x.shape}")
    if x.dtype != w.dtype:
        raise InputTypeError(f"{where}: x is {x.dtype} but w's scales are {w.dtype}; cast one of them")
    _refuse_gradient(where, x)
    rows = np.ascontiguousarray(x.data).reshape(math.prod(x.shape[:-1]), K)  # (N, K)
    out = np.empty((rows.shape[0], M), dtype=x.dtype)  # (N, M)
    if rows.shape[0]:
        if w.bits == 8 and w.layout == "in_out":
            active(int8_matmul)(rows, w.values, w.scale, out)
        elif w.bits == 8:
            active(int8_matmul_transposed)(rows, w.values, w.scale, out)
        elif w.layout == "in_out":
            active(int4_matmul)(rows, w.values, w.scale, w.group_size, out)
        else:
            active(int4_matmul_transposed)(rows, w.values, w.scale, w.group_size, out)
    return Tensor._from_array(out.reshape(x.shape[:-1] + (M,)))


def quantized_rows(ids, w):
    """Rows ids (...) of the table Wᵀ (M, K) that an "out_in" QuantizedMatrix stores (an embedding
    lookup), dequantized: (...) ints in [0, M) -> (..., K) Tensor of w's dtype, outside the graph."""
    where = "quantized_rows"
    if not isinstance(w, QuantizedMatrix):
        raise InputTypeError(f"{where}: w must be a QuantizedMatrix (from quantize), got {describe(w)}")
    if w.layout != "out_in":
        raise InputError(f"{where}: rows are looked up in a table stored with layout 'out_in', got {w.layout!r}")
    array = ids.data if isinstance(ids, Tensor) else ids
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "iu":
        raise InputTypeError(f"{where}: ids must be an integer Tensor or array, got {describe(ids)}")
    K, M = w.shape
    if array.size and (array.min() < 0 or array.max() >= M):
        bad = array[(array < 0) | (array >= M)].flat[0]
        raise InputError(f"{where}: id {bad} is out of range; ids must be in [0, {M})")
    flat = np.ascontiguousarray(array, dtype=np.int64).reshape(-1)  # (N,)
    out = np.empty((flat.shape[0], K), dtype=w.dtype)  # (N, K)
    if w.bits == 8:
        int8_rows(flat, w.values, w.scale, out)  # a lookup: too little work for a fast twin
    else:
        int4_rows(flat, w.values, w.scale, w.group_size, out)
    return Tensor._from_array(out.reshape(array.shape + (K,)))
