"""e^t, tanh and the sigmoid in plain arithmetic, so that the loops calling them vectorize.

Numba calls the C library's exp and tanh one number at a time (2-10 ns each); a loop calling them
cannot use the CPU's vector instructions. Written as a short polynomial, the same loop processes
8-16 numbers per instruction. These helpers are inlined into the kernels of softmax,
cross_entropy, attention, gelu and silu; exp was ~80% of the softmax's time and ~90% of the tanh
GELU's before them.

    exp_of_nonpositive(t) = e^t for t <= 0 (the only exponents the kernels need: they subtract a
                            maximum first, or take e^-|x|)
    tanh(u)   = sign(u) (1 - e) / (1 + e),   e = e^(-2|u|)
    sigmoid(x) = 1 / (1 + e) if x >= 0 else e / (1 + e),   e = e^(-|x|)      (never overflows)

How e^t is computed:

    t = k ln2 + r,   k = round(t / ln2) an integer,   |r| <= ln2 / 2 ~ 0.347
    e^t = 2^k e^r,   e^r ~ 1 + r + r^2/2! + ... + r^n/n!

k ln2 is subtracted in two parts, a short one (ln2 rounded to 9 bits, so k times it is exact) and a
tiny correction, which keeps r accurate to the last bit. 2^k is built exactly from its bits: the
float whose exponent field holds k plus the bias and whose fraction is 0 (`.view` reads the
integer's bits as a float).

Each float type gets the work it needs, chosen when numba compiles (`numba.extending.overload`
picks a version by the argument's type; the plain Python version picks the same one with
isinstance, so NUMBA_DISABLE_JIT=1 runs the same arithmetic):

    float32: Taylor to r^7 (truncation < 6e-9, 0.05 ulp); 2^k from a 32-bit integer,
             (k + 127) << 23 (for subnormal results, 2^(k + 64) then 2^-64).
    float64: Taylor to r^12 (truncation < 2e-16); 2^k from (k + 1023) << 52.

Exponents below -708 (float64's normal range ends at e^-708 ~ 3e-308) give 0 in both types.

NaN gives NaN and -inf gives 0, as e^t should. Measured error: ~1 ulp in float32, ~3 ulp in float64;
tanh and sigmoid are accurate to a few ulp of 1 (tests/test_vector_math.py).

Why float32 is written apart (one thread, SiLU forward over 768 x 512 float32, median of 200 calls
on a 2-core Xeon VM; the loops were already vectorized, 8 floats per instruction): ~355 µs with
float64's Taylor to r^12 and 2^k built as a float64 then rounded; ~270 µs with the helpers compiled
with `fastmath={"contract"}`, which lets LLVM fuse each Horner step p * r + c into one
fused multiply-add (it rounds once instead of twice, is never less accurate, and changes nothing
about inf and NaN, unlike fastmath=True) and Taylor to r^7; ~240 µs with 2^k built from 32 bits
(converting to 64-bit integers and float64 and back took 512-bit instructions, which run on fewer
of the CPU's ports).

Editing this file: numba's cache (cache=True) recompiles a kernel when the kernel's own file
changes, not when a helper it calls from another file does. After changing a helper here, delete
the cached kernels (`find microtensor -name '*.nbi' -delete`) or run with NUMBA_DISABLE_JIT=1.
"""
import numpy as np
from numba import njit, types
from numba.extending import overload


@njit(error_model="numpy", fastmath={"contract"})
def exp_taylor_float32(r):
    """e^r for |r| <= ln2/2 in float32: Taylor to r^7 (truncation error < 6e-9, 0.05 ulp)."""
    real = type(r)
    p = real(1 / 5040)
    p = p * r + real(1 / 720)
    p = p * r + real(1 / 120)
    p = p * r + real(1 / 24)
    p = p * r + real(1 / 6)
    p = p * r + real(1 / 2)
    p = p * r + real(1)
    return p * r + real(1)


@njit(error_model="numpy", fastmath={"contract"})
def exp_taylor_float64(r):
    """e^r for |r| <= ln2/2 in float64: Taylor to r^12 (truncation error < 2e-16)."""
    real = type(r)
    p = real(1 / 479001600)
    p = p * r + real(1 / 39916800)
    p = p * r + real(1 / 3628800)
    p = p * r + real(1 / 362880)
    p = p * r + real(1 / 40320)
    p = p * r + real(1 / 5040)
    p = p * r + real(1 / 720)
    p = p * r + real(1 / 120)
    p = p * r + real(1 / 24)
    p = p * r + real(1 / 6)
    p = p * r + real(1 / 2)
    p = p * r + real(1)
    return p * r + real(1)


def exp_taylor(r):
    """e^r for |r| <= ln2/2, as many terms as r's float type needs. This plain version runs under
    NUMBA_DISABLE_JIT=1; compiled code uses the overload below, which makes the same choice once,
    when it compiles, from r's type."""
    return exp_taylor_float32(r) if isinstance(r, np.float32) else exp_taylor_float64(r)


@overload(exp_taylor)
def _exp_taylor_by_type(r):
    if r == types.float32:
        return lambda r: exp_taylor_float32(r)
    return lambda r: exp_taylor_float64(r)


@njit(error_model="numpy")
def times_two_to_the_float32(p, k):
    """p 2^k for p in [0.7, 1.42] and an integer k <= 0, in float32: 2^k is the float32 whose
    exponent field (bits 23-30) holds k + 127 and whose fraction is 0, for k >= -126.

    Below that, where e^t is a subnormal (t < -87.3), 2^k has no such float: p 2^(k + 64) is
    computed instead (exact), then multiplied by 2^-64, which rounds once, as e^t should be.
    """
    real = type(p)
    if k < real(-150):  # p 2^k < half of float32's smallest subnormal: rounds to 0
        return real(0)
    subnormal = k < real(-126)
    j = np.int32(k) + (np.int32(64) if subnormal else np.int32(0))
    y = p * np.int32((j + 127) << 23).view(np.float32)
    return y * real(5.421010862427522e-20) if subnormal else y  # 2^-64


@njit(error_model="numpy")
def times_two_to_the_float64(p, k):
    """p 2^k for p in [0.7, 1.42] and an integer k in [-1021, 0], in float64: 2^k is the float64
    whose exponent field (bits 52-62) holds k + 1023 and whose fraction is 0."""
    two_to_k = np.int64((np.int64(k) + 1023) << 52).view(np.float64)
    return p * two_to_k


def times_two_to_the(p, k):
    """p 2^k in p's float type (see the two versions above). This plain version runs under
    NUMBA_DISABLE_JIT=1; compiled code uses the overload below, which chooses once, by type."""
    return times_two_to_the_float32(p, k) if isinstance(p, np.float32) else times_two_to_the_float64(p, k)


@overload(times_two_to_the)
def _times_two_to_the_by_type(p, k):
    if p == types.float32:
        return lambda p, k: times_two_to_the_float32(p, k)
    return lambda p, k: times_two_to_the_float64(p, k)


@njit(error_model="numpy", fastmath={"contract"})
def exp_of_nonpositive(t):
    """e^t for t <= 0, in t's own float type (float32 or float64)."""
    real = type(t)  # every constant below is converted to it: float32 math stays float32
    if t != t:  # NaN in, NaN out
        return t
    if t < real(-708.0):  # e^-708 ~ 3e-308, the end of float64's normal range; also t = -inf
        return real(0)
    k = np.floor(t * real(1.4426950408889634) + real(0.5))  # round(t / ln 2), an integer in [-1021, 0]
    # r = t - k ln2, with ln2 = 0.693359375 (exact in 9 bits, so k * 0.693359375 is exact) + a correction
    r = (t - k * real(0.693359375)) - k * real(-2.1219444005469058277e-4)  # |r| <= 0.347
    return times_two_to_the(exp_taylor(r), k)  # e^r (to r^7 in float32, r^12 in float64) times 2^k


@njit(error_model="numpy")
def tanh(u):
    """tanh u = (1 - e^-2|u|) / (1 + e^-2|u|) with u's sign; in u's float type."""
    real = type(u)
    e = exp_of_nonpositive(real(-2) * abs(u))
    t = (real(1) - e) / (real(1) + e)
    return t if u >= real(0) else -t


@njit(error_model="numpy")
def sigmoid(x):
    """σ(x) = 1 / (1 + e^-x), from e^-|x| so that nothing overflows; in x's float type."""
    real = type(x)
    e = exp_of_nonpositive(-abs(x))
    return real(1) / (real(1) + e) if x >= real(0) else e / (real(1) + e)


@njit(error_model="numpy")
def max_of_row(x, r):
    """max_c x[r, c], compared as integers so that the loop vectorizes.

    Numba does not vectorize a loop of float comparisons (it may not reorder comparisons, whose
    result with a NaN depends on the order), but it does vectorize a loop of integer maxima, which
    made the max pass ~3x faster. A float64's 64 bits, read as a signed integer, are ordered like
    the floats for non-negative floats and reversed for negative ones; flipping every bit but the
    sign of the negative ones (`^ FLIP`) puts all floats in value order (-inf < -1 < -0 < 0 < 1 < inf).
    float32 values are widened to float64 first, which is exact. A NaN sorts above +inf (or below
    -inf if its sign bit is set); either way x - max is NaN somewhere in the row, so the row's
    softmax is NaN, as it should be.
    """
    FLIP = np.int64(0x7FFFFFFFFFFFFFFF)
    best = np.float64(x[r, 0]).view(np.int64)
    best = best if best >= 0 else best ^ FLIP
    for c in range(1, x.shape[1]):
        bits = np.float64(x[r, c]).view(np.int64)
        key = bits if bits >= 0 else bits ^ FLIP
        best = key if key > best else best
    best = best if best >= 0 else best ^ FLIP  # the same flip turns the key back into the float's bits
    return x.dtype.type(np.int64(best).view(np.float64))
