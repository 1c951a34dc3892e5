"""Exercise 3: softmax backward as a JVP, and its Jacobian. The task is in README.md; write the two TODOs below.

    y = softmax(x) per row of C      J = dy/dx (C, C)      backward: dL/dx = Jᵀ g, with g = dL/dy
"""
import numpy as np

from microtensor.autograd import Function
from microtensor.errors import InputError
from microtensor.kernels import kernel


@kernel
def softmax_forward(x, y):
    """y[r] = softmax(x[r]) for every row r;  x, y: (R, C), C >= 1."""
    rows, cols = x.shape
    for r in range(rows):
        row_max = x[r, 0]  # m = max_j x_j: every exponent below is <= 0, so none overflows
        for c in range(1, cols):
            if x[r, c] > row_max:
                row_max = x[r, c]
        total = x.dtype.type(0)  # s = sum_j e^(x_j - m), at least 1
        for c in range(cols):
            y[r, c] = np.exp(x[r, c] - row_max)
            total += y[r, c]
        for c in range(cols):  # y_i = e^(x_i - m) / s
            y[r, c] = y[r, c] / total


@kernel
def softmax_backward(y, grad_y, grad_x):
    """grad_x[r] = dL/dx for row r, from y = softmax(x) and grad_y = dL/dy;  all (R, C)."""
    # TODO: for every row r: first the one number <g, y> of the row (start the sum at a typed zero,
    # y.dtype.type(0)), then, for every c, write dL/dx_c into grad_x[r, c].
    raise NotImplementedError("TODO: softmax_backward (exercise 3)")


def softmax_jacobian(y_row):
    """The (C, C) Jacobian of softmax at its output y_row (C,): entry [i, j] is dy_i/dx_j."""
    # TODO: return the (C, C) array J with J[i, j] = dy_i/dx_j, written with y only (the README derives
    # it), of y_row's dtype. numpy is fine here: no kernel.
    raise NotImplementedError("TODO: softmax_jacobian (exercise 3)")


class Softmax(Function):
    @staticmethod
    def forward(ctx, x):
        rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])  # (R, C): every leading dim counts rows
        y = np.empty_like(rows)
        softmax_forward(rows, y)
        ctx.save_for_backward(y)
        ctx.shape = x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        (y,) = ctx.saved_tensors
        grad_rows = np.ascontiguousarray(grad_out).reshape(y.shape)  # (R, C)
        grad_x = np.empty_like(y)
        softmax_backward(y, grad_rows, grad_x)
        return grad_x.reshape(ctx.shape)


def softmax(x):
    """softmax over the last dim of a float tensor of any shape (..., C), C >= 1."""
    if x.ndim == 0 or x.shape[-1] == 0:
        raise InputError(f"softmax: expected a tensor whose last dim has at least 1 number, got shape {x.shape}")
    return Softmax.apply(x)
