"""Exercise 16: a LoRA layer. The reference solution.

    y = x W + s (x A) B,   s = α / r       x (N, in), W (in, out) frozen, A (in, r), B (r, out)

    backward: derive dx (N, in), dA (in, r), dB (r, out) (README: The backward); no dW: W is frozen
"""
import numpy as np

from microtensor.autograd import Function


class LoRALinear(Function):
    @staticmethod
    def forward(ctx, x, weight, lora_a, lora_b, scale):
        s = x.dtype.type(scale)  # typed: a float64 numpy scalar would turn float32 products into float64
        xa = x @ lora_a  # (N, r): thin, never the (in, out) matrix A B
        y = x @ weight + s * (xa @ lora_b)  # (N, out)
        ctx.save_for_backward(x, weight, lora_a, lora_b, xa)
        ctx.scale = s
        return y

    @staticmethod
    def backward(ctx, grad_out):
        """grad_out = g = dL/dy (N, out). Returns one entry per input of forward:
        (dL/dx (N, in), None for the frozen weight, dL/dA (in, r), dL/dB (r, out), None for scale)."""
        x, weight, lora_a, lora_b, xa = ctx.saved_tensors
        s = ctx.scale
        g = grad_out  # (N, out)
        h = s * (g @ lora_b.T)  # (N, r): dL/dxa, since y depends on xa through s xa B
        grad_b = s * (xa.T @ g)  # (r, N) @ (N, out) = (r, out)
        grad_a = x.T @ h  # (in, N) @ (N, r) = (in, r)
        grad_x = g @ weight.T + h @ lora_a.T  # the base path plus the low-rank path, (N, in)
        return grad_x, None, grad_a, grad_b, None  # no dW: the base weight is frozen


def lora_linear(x, weight, lora_a, lora_b, alpha):
    """y = x W + (alpha / r) (x A) B for Tensors x (N, in), weight (in, out), lora_a (in, r),
    lora_b (r, out), all of one float dtype; alpha a number > 0. Returns y (N, out)."""
    (n_in, n_out), rank = weight.shape, lora_a.shape[1]
    if x.ndim != 2 or x.shape[1] != n_in or lora_a.shape[0] != n_in or lora_b.shape != (rank, n_out):
        raise ValueError(
            f"lora_linear: expected x (N, in), weight (in, out), lora_a (in, r), lora_b (r, out); got x {x.shape}, "
            f"weight {weight.shape}, lora_a {lora_a.shape}, lora_b {lora_b.shape}"
        )
    return LoRALinear.apply(x, weight, lora_a, lora_b, alpha / rank)


def init_adapter(n_in, n_out, rank, rng, dtype=np.float64):
    """A fresh adapter (A, B) for a weight (n_in, n_out), as numpy arrays of dtype: A (n_in, rank)
    uniform in [−1/√n_in, 1/√n_in] drawn from rng (a numpy Generator), B (rank, n_out) zeros."""
    bound = 1.0 / np.sqrt(n_in)  # as a Linear layer's weight starts
    lora_a = rng.uniform(-bound, bound, size=(n_in, rank)).astype(dtype)
    lora_b = np.zeros((rank, n_out), dtype=dtype)  # A B = 0: the layer starts as the base layer
    return lora_a, lora_b


def merge(weight, lora_a, lora_b, alpha):
    """The merged weight W' = W + (alpha / r) A B (in, out), numpy arrays in, one numpy array of
    weight's dtype out: x W' is the layer's function with no adapter left."""
    rank = lora_a.shape[1]
    return (weight + (alpha / rank) * (lora_a @ lora_b)).astype(weight.dtype)  # (in, out)
