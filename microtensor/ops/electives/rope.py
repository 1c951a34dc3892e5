"""Rotary position embedding (RoPE): rotate each pair of features by an angle that grows with the
token's position, so that q·k depends on the distance between the two positions.

For x (B, H, T, D), D even, position t = offset + (index along T), and pair i = (x_{2i}, x_{2i+1}):

    θ_i = base^(-2i/D),   angle = t θ_i                                 (T, D/2)
    y_{2i}   = x_{2i} cos(angle) - x_{2i+1} sin(angle)
    y_{2i+1} = x_{2i} sin(angle) + x_{2i+1} cos(angle)

Each pair is multiplied by a rotation matrix R (2, 2). Rotations are orthogonal, R⁻¹ = Rᵀ, so the
backward is the rotation by the opposite angle:

    dL/dx_{2i}   =  g_{2i} cos(angle) + g_{2i+1} sin(angle)
    dL/dx_{2i+1} = -g_{2i} sin(angle) + g_{2i+1} cos(angle)

Forward mode (JVP): y is linear in x, so a tangent t of x rotates exactly as x does: dy = R t
(the same angles, not the opposite ones).

Elementwise on pairs, memory-bound: numpy expressions, no kernel. `offset` lets a KV cache rotate
a new token by its absolute position.
"""
import numpy as np

from ...autograd import Function
from ...checks import check_float, check_int
from ...errors import InputError
from ...gradcheck import gradcheck_case


def rope_angles(T, D, offset, dtype, base=10000.0):
    """cos and sin of position * θ_i, each (T, D/2)."""
    theta = base ** (-np.arange(0, D, 2, dtype=np.float64) / D)  # (D/2,)
    angle = np.arange(offset, offset + T, dtype=np.float64)[:, None] * theta[None, :]  # (T, D/2)
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


def _rotate(x, cos, sin):
    """Rotate pairs of the last dim of x (..., T, D) by the angles whose cos and sin are (T, D/2)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    y = np.empty_like(x)
    y[..., 0::2] = even * cos - odd * sin
    y[..., 1::2] = even * sin + odd * cos
    return y


class RoPE(Function):
    """y = each pair of x rotated by its angle.   dL/dx = g rotated back.   JVP: dy = t rotated forward."""

    @staticmethod
    def forward(ctx, x, offset):
        cos, sin = rope_angles(x.shape[-2], x.shape[-1], offset, x.dtype)
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, grad_out):
        cos, sin = ctx.saved_tensors
        return _rotate(grad_out, cos, -sin), None

    @staticmethod
    def jvp(ctx, tangent, _offset):
        cos, sin = ctx.saved_tensors
        return _rotate(tangent, cos, sin)


def rope(x, offset=0):
    """Rotary position embedding of x (..., T, D) for positions offset .. offset + T - 1 (offset an int >= 0)."""
    check_float("rope", x)
    if x.ndim < 2 or x.shape[-1] % 2:
        raise InputError(f"rope: expected (..., T, D) with D even, got shape {x.shape}")
    offset = check_int("rope", "offset", offset, low=0, high=2**53 - x.shape[-2])  # positions exact as float64
    return RoPE.apply(x, offset)


@gradcheck_case(RoPE)
def _rope_case(draw):
    shape = draw.shape(min_dims=1, max_dims=2, max_side=3) + (draw.integer(1, 4), 2 * draw.integer(1, 3))
    offset = draw.integer(0, 5)
    return (lambda x: rope(x, offset)), (draw.tensor(shape),)
