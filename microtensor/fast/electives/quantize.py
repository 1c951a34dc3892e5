"""The fast twins of the quantized products (microtensor/ops/electives/quantize.py): the same arguments, the
same sums.

- int4_matmul: `out` is cut into tiles of ROW_BLOCK rows by COLUMN_BLOCK columns, spread over
  Numba's threads. Within a tile, one group's rows of codes are unpacked into floats once, into a
  buffer (G, COLUMN_BLOCK) that every row of the tile then uses; the readable kernel unpacks each
  code again for every row n (a shift, a mask and a conversion per multiply-add). The hot loop
  reads only that buffer and one row of partial sums, and vectorizes. Every output's sums are
  taken in the readable kernel's order (k ascending within a group, groups in order), so the
  results are equal to the bit.
- int8_matmul_transposed, int4_matmul_transposed: the tied head's products, x @ Eᵀ. Tiles of
  ROW_BLOCK_DOT rows of x by one row m of the table: the row is dequantized into floats once per
  tile (int4: with its group scales, s_gm q_mk), then dotted with each row of x. Compiled with
  REDUCE_FASTMATH so that the dot products vectorize; the additions are reordered (and, for int4,
  each term carries its group's scale instead of each group's sum), so the results agree with the
  readable kernels up to rounding.
- int8_matmul has no twin: its readable loops (n, k, m, the int8 row converted inside the
  contiguous inner loop over m, rows in parallel) already vectorize; tiling it the same way as
  int4 adds copying and gains nothing, as there is no unpacking to save.
- Each twin hands its tiles to a kernel in one share per thread, so that a thread makes its
  buffers once, not once per tile. The thread count is read in Python and passed in: read inside
  a kernel, it would keep Numba from caching the kernel on disk.
- quantize_groups, int8_rows and int4_rows have no twin: quantizing runs once per weight, and a
  lookup copies one row per token.
"""
import numba
import numpy as np
from numba import prange

from ...kernels import fast_twin, kernel
from ...ops.electives import quantize as readable
from ..vector_math import REDUCE_FASTMATH

ROW_BLOCK = 16  # rows of x per tile: each unpacked group of codes is used this many times
COLUMN_BLOCK = 256  # columns per tile: a group's unpacked codes (G, 256) stay in the cache
ROW_BLOCK_DOT = 64  # rows of x per tile of the transposed products: each dequantized row is used this often


@fast_twin(readable.int4_matmul)
def int4_matmul(x, packed, scale, group_size, out):
    """out (N, M) = sum_g scale[g, m] * sum_{k in g} x[n, k] q[k, m], by tiles (see the module docstring)."""
    int4_matmul_tiles(x, packed, scale, group_size, out, numba.get_num_threads())


@kernel(parallel=True)
def int4_matmul_tiles(x, packed, scale, group_size, out, threads):
    """int4_matmul's tiles, in one share per thread (so that each thread makes its buffers once).
    The loops index rows taken out as 1-D views (`out_row = out[n, m0:m0 + width]`), whose
    indices start at 0: an index such as m0 + j, which Numba cannot prove >= 0, gets a check for
    negative indices that keeps the loop from vectorizing."""
    N, K = x.shape
    M = out.shape[1]
    column_blocks = (M + COLUMN_BLOCK - 1) // COLUMN_BLOCK
    tiles = (N + ROW_BLOCK - 1) // ROW_BLOCK * column_blocks
    shares = max(1, min(tiles, threads))
    for share in prange(shares):
        codes = np.empty((group_size, COLUMN_BLOCK), dtype=x.dtype)  # one group's codes for the tile's columns, as floats
        partial = np.empty(COLUMN_BLOCK, dtype=x.dtype)  # one row's sums over the group
        sums = np.empty((ROW_BLOCK, COLUMN_BLOCK), dtype=x.dtype)  # the tile's outputs
        for tile in range(share * tiles // shares, (share + 1) * tiles // shares):
            n0, m0 = tile // column_blocks * ROW_BLOCK, tile % column_blocks * COLUMN_BLOCK
            rows, width = min(ROW_BLOCK, N - n0), min(COLUMN_BLOCK, M - m0)
            sums[:] = 0
            for g in range(scale.shape[0]):
                start, stop = g * group_size, min(K, (g + 1) * group_size)
                scale_row = scale[g, m0 : m0 + width]
                for k in range(start, stop):
                    packed_row, codes_row, shift = packed[k // 2, m0 : m0 + width], codes[k - start], 4 * (k % 2)
                    for j in range(width):
                        codes_row[j] = x.dtype.type(((packed_row[j] >> shift) & 15) - 8)
                for i in range(rows):
                    partial[:] = 0
                    for k in range(start, stop):
                        x_ik, codes_row = x[n0 + i, k], codes[k - start]
                        for j in range(width):
                            partial[j] += x_ik * codes_row[j]
                    sums_row = sums[i]
                    for j in range(width):
                        sums_row[j] += scale_row[j] * partial[j]
            for i in range(rows):
                out_row, sums_row = out[n0 + i, m0 : m0 + width], sums[i]
                for j in range(width):
                    out_row[j] = sums_row[j]


@fast_twin(readable.int8_matmul_transposed)
def int8_matmul_transposed(x, q_t, scale, out):
    """out (N, M) = scale[m] * sum_k x[n, k] q_t[m, k]: vectorized dot products, by tiles."""
    int8_matmul_transposed_tiles(x, q_t, scale, out, numba.get_num_threads())


@kernel(parallel=True, fastmath=REDUCE_FASTMATH)
def int8_matmul_transposed_tiles(x, q_t, scale, out, threads):
    """int8_matmul_transposed's tiles, in one share per thread."""
    N, K = x.shape
    M = q_t.shape[0]
    zero = x.dtype.type(0)
    tiles = (N + ROW_BLOCK_DOT - 1) // ROW_BLOCK_DOT * M
    shares = max(1, min(tiles, threads))
    for share in prange(shares):
        codes = np.empty(K, dtype=x.dtype)  # row m of q_t, as floats
        for tile in range(share * tiles // shares, (share + 1) * tiles // shares):
            n0, m = tile // M * ROW_BLOCK_DOT, tile % M
            q_row = q_t[m]
            for k in range(K):
                codes[k] = q_row[k]
            for n in range(n0, min(N, n0 + ROW_BLOCK_DOT)):
                x_row = x[n]
                total = zero
                for k in range(K):
                    total += x_row[k] * codes[k]
                out[n, m] = scale[m] * total


@fast_twin(readable.int4_matmul_transposed)
def int4_matmul_transposed(x, packed_t, scale_t, group_size, out):
    """out (N, M) = sum_k x[n, k] (scale_t[m, k // G] q[m, k]): one dequantized row, dotted with each row of x."""
    int4_matmul_transposed_tiles(x, packed_t, scale_t, group_size, out, numba.get_num_threads())


@kernel(parallel=True, fastmath=REDUCE_FASTMATH)
def int4_matmul_transposed_tiles(x, packed_t, scale_t, group_size, out, threads):
    """int4_matmul_transposed's tiles, in one share per thread."""
    N, K = x.shape
    M = packed_t.shape[0]
    zero = x.dtype.type(0)
    tiles = (N + ROW_BLOCK_DOT - 1) // ROW_BLOCK_DOT * M
    shares = max(1, min(tiles, threads))
    for share in prange(shares):
        row = np.empty(K, dtype=x.dtype)  # row m of the table, dequantized: s_gm q_mk
        for tile in range(share * tiles // shares, (share + 1) * tiles // shares):
            n0, m = tile // M * ROW_BLOCK_DOT, tile % M
            packed_row = packed_t[m]
            for g in range(scale_t.shape[1]):
                s = scale_t[m, g]
                for k in range(g * group_size, min(K, (g + 1) * group_size)):
                    row[k] = s * x.dtype.type(((packed_row[k // 2] >> (4 * (k % 2))) & 15) - 8)
            for n in range(n0, min(N, n0 + ROW_BLOCK_DOT)):
                x_row = x[n]
                total = zero
                for k in range(K):
                    total += x_row[k] * row[k]
                out[n, m] = total
