"""Exercise 16: a LoRA layer. The task is in README.md; write the TODOs below.

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
        # TODO: derive dx, dA and dB (README: The backward; the gradient h at xa (N, r) first) and
        # compute them from g, the saved arrays and s. Return (dx, None, dA, dB, None): the weight
        # gets None, always (it is frozen).
        raise NotImplementedError("TODO: LoRALinear.backward (exercise 16)")


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
    # TODO: A from rng.uniform(low, high, size), cast to dtype; B all zeros of dtype.
    raise NotImplementedError("TODO: init_adapter (exercise 16)")


def merge(weight, lora_a, lora_b, alpha):
    """The merged weight W' = W + (alpha / r) A B (in, out), numpy arrays in, one numpy array of
    weight's dtype out: x W' is the layer's function with no adapter left."""
    # TODO: r is lora_a's second dim; return weight + (alpha / r) * (lora_a @ lora_b) in weight's dtype.
    raise NotImplementedError("TODO: merge (exercise 16)")
