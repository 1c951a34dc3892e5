"""e^t, tanh, the sigmoid, erf and a row's max in plain arithmetic, so that the loops calling them vectorize.

The fast kernel set's math. Numba compiles np.exp, np.tanh and math.erf into calls to the C
library, one number per call, and a loop that makes a call per element cannot use the CPU's vector
instructions. Written as a short polynomial or rational function, the same loop handles several
numbers per instruction. The fast twins of softmax, cross_entropy, attention, gelu and silu (and
generation's decode step) call these helpers, which Numba inlines into them; the readable kernels
never do (they call the C library's functions, which is what their formulas say).

    exp_of_nonpositive(t) = e^t for t <= 0 (the only exponents the kernels need: they subtract a
                            maximum first, or take e^-|x|)
    exp_of_normal_range(t) = the same for t in [-87, 0], without the checks for the ends of the range
    tanh(u)    = sign(u) (1 - e) / (1 + e),   e = e^(-2 min(|u|, 19.1))
    sigmoid(x) = 1 / (1 + e) if x >= 0 else e / (1 + e),   e = e^(-|x|)      (never overflows)
    erf(x)     = sign(x) a P(a²) / Q(a²),   a = min(|x|, 3.92)    in float32; math.erf in float64
    max_of_row(x, r) = max_c x[r, c]

How e^t is computed:

    t = k ln2 + r,   k = round(t / ln2) an integer,   |r| <= ln2 / 2 ~ 0.347
    e^t = 2^k e^r,   e^r ~ 1 + r + r^2/2! + ... + r^n/n!

k ln2 is subtracted in two parts, a short one (ln2 rounded to 9 bits, so k times it is exact) and a
tiny correction, which keeps r accurate to the last bit. 2^k is built exactly from its bits: the
float whose exponent field holds k plus the bias and whose fraction is 0 (`.view` reads the
integer's bits as a float).

Each float type gets the work it needs, chosen when Numba compiles (`numba.extending.overload`
picks a version by the argument's type; the plain Python version, which is what runs when the
function is called from Python, picks the same one with isinstance):

    float32: Taylor to r^7 (truncation < 6e-9, 0.05 ulp); 2^k from a 32-bit integer,
             (k + 127) << 23 (for subnormal results, 2^(k + 64) then 2^-64).
    float64: Taylor to r^12 (truncation < 2e-16); 2^k from (k + 1023) << 52.

float32 is written apart rather than computed through float64 because float32 is the training
type: fewer Taylor terms are enough for its precision, and staying in 32-bit integers and floats
keeps twice as many numbers in each vector instruction. The Taylor polynomials are compiled with
`fastmath={"contract"}`, which lets LLVM fuse each Horner step p * r + c into one fused
multiply-add (it rounds once instead of twice, is never less accurate, and changes nothing about
inf and NaN, unlike fastmath=True).

Exponents below -708 (float64's normal range ends at e^-708 ~ 3e-308) give 0 in both types; NaN
gives NaN and -inf gives 0, as e^t should. tests/test_vector_math.py holds e^t to 2 ulp in float32
and 8 in float64, tanh and the sigmoid to 4 ulp of 1, erf to 6 ulp in float32.

A kernel calling these helpers is recompiled when this file changes: `kernels.kernel` keys its
cache on every source file.
"""
import math

import numpy as np
from numba import types
from numba.extending import overload

from ..kernels import kernel

# Reductions (row maxima, row sums, dot products) vectorize only if the compiler may reorder the
# additions; these flags allow that and nothing else (inf and NaN keep their meaning).
REDUCE_FASTMATH = {"reassoc", "contract", "arcp"}


@kernel(fastmath={"contract"})
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


@kernel(fastmath={"contract"})
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
    """e^r for |r| <= ln2/2, as many terms as r's float type needs. This plain version is what
    Python runs; compiled code uses the overload below, which makes the same choice once, when it
    compiles, from r's type."""
    return exp_taylor_float32(r) if isinstance(r, np.float32) else exp_taylor_float64(r)


@overload(exp_taylor)
def _exp_taylor_by_type(r):
    if r == types.float32:
        return lambda r: exp_taylor_float32(r)
    return lambda r: exp_taylor_float64(r)


@kernel
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


@kernel
def times_two_to_the_float64(p, k):
    """p 2^k for p in [0.7, 1.42] and an integer k in [-1021, 0], in float64: 2^k is the float64
    whose exponent field (bits 52-62) holds k + 1023 and whose fraction is 0."""
    two_to_k = np.int64((np.int64(k) + 1023) << 52).view(np.float64)
    return p * two_to_k


def times_two_to_the(p, k):
    """p 2^k in p's float type (see the two versions above). This plain version is what Python
    runs; compiled code uses the overload below, which chooses once, by type."""
    return times_two_to_the_float32(p, k) if isinstance(p, np.float32) else times_two_to_the_float64(p, k)


@overload(times_two_to_the)
def _times_two_to_the_by_type(p, k):
    if p == types.float32:
        return lambda p, k: times_two_to_the_float32(p, k)
    return lambda p, k: times_two_to_the_float64(p, k)


@kernel
def two_to_the_float32(k):
    """2^k for an integer k in [-126, 0] (a float32 holding it): the float32 whose exponent field
    holds k + 127 and whose fraction is 0."""
    return np.int32((np.int32(k) + 127) << 23).view(np.float32)


def two_to_the(k, like):
    """2^k, k an integer in [-126, 0], in the float type of `like`. This plain version is what
    Python runs; compiled code uses the overload below, which chooses once, by type."""
    return two_to_the_float32(k) if isinstance(like, np.float32) else times_two_to_the_float64(np.float64(1), k)


@overload(two_to_the)
def _two_to_the_by_type(k, like):
    if like == types.float32:
        return lambda k, like: two_to_the_float32(k)
    return lambda k, like: times_two_to_the_float64(np.float64(1), k)


@kernel(fastmath={"contract"})
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


@kernel(fastmath={"contract"})
def exp_of_normal_range(t):
    """e^t for t in [-87, 0], where e^t is a normal number in float32 and float64 alike (a NaN
    comes out NaN, through r): exp_of_nonpositive without its checks for NaN, underflow and
    subnormal results, which a vectorized loop would pay for on every element. The caller keeps t
    in range."""
    real = type(t)
    k = np.floor(t * real(1.4426950408889634) + real(0.5))  # in [-126, 0]
    r = (t - k * real(0.693359375)) - k * real(-2.1219444005469058277e-4)
    return exp_taylor(r) * two_to_the(k, r)


@kernel
def tanh(u):
    """tanh u = (1 - e^-2|u|) / (1 + e^-2|u|) with u's sign; in u's float type. |u| is clamped at
    19.1, where tanh rounds to 1 in float64 (and in float32 long before), so that e^-2|u| stays in
    exp_of_normal_range's range: inf gives 1, NaN stays NaN (it fails the comparison)."""
    real = type(u)
    a = abs(u)
    a = real(19.1) if a > real(19.1) else a
    e = exp_of_normal_range(real(-2) * a)
    t = (real(1) - e) / (real(1) + e)
    return t if u >= real(0) else -t


@kernel
def sigmoid(x):
    """σ(x) = 1 / (1 + e^-x), from e^-|x| so that nothing overflows; in x's float type."""
    real = type(x)
    e = exp_of_nonpositive(-abs(x))
    return real(1) / (real(1) + e) if x >= real(0) else e / (real(1) + e)


@kernel(fastmath={"contract"})
def erf_float32(x):
    """erf x in float32: a = min(|x|, 3.92), erf x = sign(x) a P(a²) / Q(a²), P and Q of degree 5.

    Branch-free, so that the loops calling it vectorize. P/Q is a rational fit of erf(a)/a in a²,
    made for this file (minimax in relative error on [0, 3.92], error 2e-8 before rounding); above
    3.92, erf rounds to 1 in float32. tests/test_vector_math.py holds it within 6 ulp of math.erf.
    """
    real = type(x)
    a = abs(x)
    a = real(3.92) if a > real(3.92) else a  # a NaN fails the test and stays NaN
    z = a * a
    p = real(2.050009009915606e-06)
    p = p * z + real(0.00028487772882269995)
    p = p * z + real(0.0037656276933324424)
    p = p * z + real(0.05274872319333557)
    p = p * z + real(0.19040743174367022)
    p = p * z + real(1.1283791461432506)  # 2/√π: erf a ~ 2a/√π near 0
    q = real(3.809064657959585e-05)
    q = q * z + real(0.001162528665687633)
    q = q * z + real(0.014969236605558744)
    q = q * z + real(0.11410939624193382)
    q = q * z + real(0.5020769338682672)
    q = q * z + real(1)
    y = a * p / q
    y = real(1) if y > real(1) else y
    return y if x >= real(0) else -y


def erf(x):
    """erf x in x's float type: erf_float32 for float32 (the training type, where speed matters),
    the C library's math.erf for float64 (gradient checks and tests, where the last bit matters more
    than vectorizing). This plain version is what Python runs; compiled code uses the overload
    below, which chooses once, by type."""
    return erf_float32(x) if isinstance(x, np.float32) else math.erf(x)


@overload(erf)
def _erf_by_type(x):
    if x == types.float32:
        return lambda x: erf_float32(x)
    return lambda x: math.erf(x)


@kernel
def max_of_row(x, r):
    """max_c x[r, c], compared as integers so that the loop vectorizes.

    Numba does not vectorize a loop of float comparisons (it may not reorder comparisons, whose
    result with a NaN depends on the order), but it does vectorize a loop of integer maxima. A
    float64's 64 bits, read as a signed integer, are ordered like the floats for non-negative floats
    and reversed for negative ones; flipping every bit but the sign of the negative ones (`^ FLIP`)
    puts all floats in value order (-inf < -1 < -0 < 0 < 1 < inf).
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
