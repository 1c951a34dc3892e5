"""The deliberate bugs of the mutation suite (run by mutation/run.py), one `Mutant` each.

A mutant names the file (relative to the project root), a snippet of its source that occurs there
exactly once, what the snippet becomes, and the pytest arguments of the smallest set of tests that
should fail because of it. Each is a real change of behaviour (never an equivalent rewrite): a bug
someone could plausibly write, in the place where the tests must catch it.

`jit=False` runs the tests with NUMBA_DISABLE_JIT=1 (the readable kernels as Python, the fast set
skipped): for mutants of readable kernels and of plain numpy code, whose tests need nothing compiled.
`jit=True` compiles: for the fast twins, which exist only compiled, and for mutants outside
microtensor/, whose tests then reuse the kernels already compiled for the unchanged package.

Names read `<what>.<which part>[.<kernel set>]`. To add a mutant, see mutation/README.md.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    original: str
    replacement: str
    tests: str  # pytest arguments: files, node ids, -k expressions
    jit: bool = False
    why: str = ""  # what the bug is, where it is not obvious from the snippets


def gradcheck_cases(kernel_set, case):
    """The pytest arguments that run the registered gradient checks of one op in one kernel set."""
    return f'tests/test_gradcheck_cases.py -k "{kernel_set} and {case}"'


def forward_mode_cases(kernel_set, case):
    """The pytest arguments that run the forward-mode checks (finite differences and the dot-product test) of one op."""
    return f'tests/test_forward_mode.py -k "{kernel_set} and {case}"'


MUTANTS = [
    # ----------------------------------------------------------------------------- forward-mode (JVP) rules
    Mutant(
        "layer_norm.jvp_dropped_term", "microtensor/ops/layer_norm.py",
        "tangent_xhat = rstd[:, None] * (t - t.mean(axis=1, keepdims=True) - xhat * (xhat * t).mean(axis=1, keepdims=True))",
        "tangent_xhat = rstd[:, None] * (t - t.mean(axis=1, keepdims=True))",
        forward_mode_cases("readable", "LayerNorm"),
        why="LayerNorm's JVP forgets that rstd moves with x: the - xhat mean(xhat t) term",
    ),
    Mutant(
        "softmax.jvp_dropped_term", "microtensor/ops/softmax.py",
        "tangent_rows = out_rows * (t - np.sum(out_rows * t, axis=1, keepdims=True))  # y (t - <y, t>)",
        "tangent_rows = out_rows * t  # y (t - <y, t>)",
        forward_mode_cases("readable", "Softmax-softmax"),
        why="softmax's JVP keeps only the Jacobian's diagonal, diag(y) t",
    ),
    Mutant(
        "div.jvp_sign", "microtensor/ops/elementwise.py",
        "None if tangent_b is None else -tangent_b * y / b,",
        "None if tangent_b is None else tangent_b * y / b,",
        forward_mode_cases("readable", "Div"),
        why="the quotient rule's minus sign lost in the divisor's tangent",
    ),
    Mutant(
        "attention.jvp_softmax_centering", "microtensor/ops/attention.py",
        "d_probs = probs * (d_scores - np.sum(probs * d_scores, axis=-1, keepdims=True))  # (B, H, Tq, Tk)",
        "d_probs = probs * d_scores  # (B, H, Tq, Tk)",
        forward_mode_cases("readable", "ScaledDotProductAttention"),
        why="attention's JVP passes the scores' tangent through the softmax without subtracting <P, dS>",
    ),
    Mutant(
        "gradcheck.jvp_difference_quotient_sign", "microtensor/gradcheck.py",
        "difference_quotient = (plus - minus) / (2 * eps)",
        "difference_quotient = (minus - plus) / (2 * eps)",
        forward_mode_cases("readable", "Exp"),
        why="jvpcheck's finite differences step the wrong way: every right JVP would read as wrong",
    ),
    # ----------------------------------------------------------------------------- readable kernels
    Mutant(
        "softmax.backward.readable", "microtensor/ops/softmax.py",
        "grad_x[r, c] = y[r, c] * (grad_y[r, c] - dot)",
        "grad_x[r, c] = y[r, c] * grad_y[r, c]",
        gradcheck_cases("readable", "Softmax-softmax"),
        why="the softmax JVP without its - <g, y> term: right on the Jacobian's diagonal only",
    ),
    Mutant(
        "log_softmax.backward.readable", "microtensor/ops/softmax.py",
        "grad_x[r, c] = grad_z[r, c] - np.exp(z[r, c]) * total",
        "grad_x[r, c] = grad_z[r, c] - np.exp(z[r, c])",
        gradcheck_cases("readable", "LogSoftmax"),
        why="forgets to multiply the probabilities by sum(g)",
    ),
    Mutant(
        "cross_entropy.backward_scale.readable", "microtensor/ops/cross_entropy.py",
        "row_scale = scale * inverse_total[n]  # (g / N_valid) / s_n",
        "row_scale = inverse_total[n]  # (g / N_valid) / s_n",
        gradcheck_cases("readable", "CrossEntropy"),
        why="the probabilities' part of the gradient not scaled by g / N_valid",
    ),
    Mutant(
        "cross_entropy.backward_onehot.readable", "microtensor/ops/cross_entropy.py",
        "grad_logits[n, t] -= scale  # minus (g / N_valid) [v == t_n]",
        "grad_logits[n, t] -= row_scale  # minus (g / N_valid) [v == t_n]",
        gradcheck_cases("readable", "CrossEntropy"),
        why="the one-hot term divided by the row's sum of exponentials too",
    ),
    Mutant(
        "cross_entropy.backward_counts_ignored_rows", "microtensor/ops/cross_entropy.py",
        "scale = (grad_out / grad_out.dtype.type(ctx.valid_count))[()]",
        "scale = (grad_out / grad_out.dtype.type(targets.shape[0]))[()]",
        gradcheck_cases("readable", "CrossEntropy"),
        why="backward divides by every row, ignored ones included, while forward averages over the valid rows",
    ),
    Mutant(
        "layer_norm.backward_input.readable", "microtensor/ops/layer_norm.py",
        "grad_x[n, c] = r * (grad_out[n, c] * weight[c] - d_mean - xhat * d_xhat_mean)",
        "grad_x[n, c] = r * (grad_out[n, c] * weight[c] - xhat * d_xhat_mean)",
        gradcheck_cases("readable", "LayerNorm"),
        why="forgets the mean's own path (the - mean(d) term)",
    ),
    Mutant(
        "layer_norm.backward_weight.readable", "microtensor/ops/layer_norm.py",
        "grad_weight[c] += grad_out[n, c] * (x[n, c] - m) * r",
        "grad_weight[c] += grad_out[n, c] * x[n, c] * r",
        gradcheck_cases("readable", "LayerNorm"),
        why="the weight's gradient uses x * rstd instead of xhat (the mean not subtracted)",
    ),
    Mutant(
        "rms_norm.backward_input.readable", "microtensor/ops/electives/rms_norm.py",
        "grad_x[n, c] = r * (grad_out[n, c] * weight[c] - x[n, c] * r * d_xhat_mean)",
        "grad_x[n, c] = r * grad_out[n, c] * weight[c]",
        gradcheck_cases("readable", "RMSNorm"),
        why="treats rstd as a constant: the path through the row's root mean square is lost",
    ),
    Mutant(
        "rms_norm.backward_weight.readable", "microtensor/ops/electives/rms_norm.py",
        "grad_weight[c] += grad_out[n, c] * x[n, c] * rstd[n]",
        "grad_weight[c] += grad_out[n, c] * x[n, c]",
        gradcheck_cases("readable", "RMSNorm"),
    ),
    Mutant(
        "gelu.tanh_backward.readable", "microtensor/ops/gelu.py",
        "du_dx = k * (one + three * a * x[i] ** 2)",
        "du_dx = k * (one + a * x[i] ** 2)",
        gradcheck_cases("readable", "GELU"),
        why="d(a x³)/dx taken as a x² (the 3 dropped)",
    ),
    Mutant(
        "gelu.erf_backward.readable", "microtensor/ops/gelu.py",
        "grad_x[i] = grad_out[i] * (cdf + x[i] * pdf)",
        "grad_x[i] = grad_out[i] * cdf",
        gradcheck_cases("readable", "GELU"),
        why="the product rule's x φ(x) term dropped",
    ),
    Mutant(
        "silu.backward.readable", "microtensor/ops/electives/silu.py",
        "dy_dx = s * (one + x[i] * (one - s))",
        "dy_dx = s * (one + x[i] * s)",
        gradcheck_cases("readable", "SiLU"),
        why="σ' written as σ² instead of σ (1 - σ)",
    ),
    Mutant(
        "swiglu.backward_gate.readable", "microtensor/ops/electives/silu.py",
        "grad_a[i] = grad_out[i] * b[i] * dsilu_da",
        "grad_a[i] = grad_out[i] * dsilu_da",
        gradcheck_cases("readable", "SwiGLU"),
        why="the gate's gradient forgets the value b it multiplies",
    ),
    Mutant(
        "swiglu.backward_value.readable", "microtensor/ops/electives/silu.py",
        "grad_b[i] = grad_out[i] * a[i] * s",
        "grad_b[i] = grad_out[i] * s",
        gradcheck_cases("readable", "SwiGLU"),
        why="the value's gradient is σ(a) instead of silu(a) = a σ(a)",
    ),
    Mutant(
        "embedding.backward.readable", "microtensor/ops/embedding.py",
        "grad_weight[row, c] += grad_out[n, c]",
        "grad_weight[row, c] = grad_out[n, c]",
        gradcheck_cases("readable", "Embedding") + " tests/ops/test_embedding.py tests/ops/test_fused_ops.py",
        why="an id used twice keeps only its last gradient instead of the sum",
    ),
    Mutant(
        "matmul.backward_a.readable", "microtensor/ops/matmul.py",
        "matmul_forward(grad, np.ascontiguousarray(b.T), grad_a)",
        "matmul_forward(grad, np.ascontiguousarray(b.T[::-1]), grad_a)",
        gradcheck_cases("readable", "MatMul"),
        why="dA = g Bᵀ with the columns of g paired with the wrong columns of B",
    ),
    Mutant(
        "matmul.backward_b.readable", "microtensor/ops/matmul.py",
        "matmul_forward(np.ascontiguousarray(a.T), grad, grad_b)",
        "matmul_forward(np.ascontiguousarray(a.T[:, ::-1]), grad, grad_b)",
        gradcheck_cases("readable", "MatMul"),
        why="dB = Aᵀ g with the rows of A paired with the wrong rows of g",
    ),
    Mutant(
        "attention.backward_dq_scale.readable", "microtensor/ops/attention.py",
        "grad_q[b, h, i, d] += d_score * scale * k[b, g, j, d]",
        "grad_q[b, h, i, d] += d_score * k[b, g, j, d]",
        gradcheck_cases("readable", "Attention"),
        why="the 1/√D of S = q kᵀ / √D missing from dq",
    ),
    Mutant(
        "attention.backward_dk_scale.readable", "microtensor/ops/attention.py",
        "grad_k[b, g, j, d] += d_score * scale * q[b, h, i, d]",
        "grad_k[b, g, j, d] += d_score * q[b, h, i, d]",
        gradcheck_cases("readable", "Attention"),
        why="the 1/√D of S = q kᵀ / √D missing from dk",
    ),
    Mutant(
        "attention.backward_softmax_jvp.readable", "microtensor/ops/attention.py",
        "d_score = p * (d_probs[j] - row_dot)  # dS_ij",
        "d_score = p * d_probs[j]  # dS_ij",
        gradcheck_cases("readable", "Attention"),
    ),
    Mutant(
        "attention.backward_dv.readable", "microtensor/ops/attention.py",
        "grad_v[b, g, j, d] += p * grad_out[b, h, i, d]",
        "grad_v[b, g, j, d] += grad_out[b, h, i, d]",
        gradcheck_cases("readable", "Attention"),
        why="dv = Pᵀ dO without the P",
    ),
    Mutant(
        "attention.causal_mask.readable", "microtensor/ops/attention.py",
        "last = position if causal else Tk - 1  # the last key query i may see",
        "last = position - 1 if causal else Tk - 1  # the last key query i may see",
        "tests/ops/test_attention.py",
        why="a query no longer sees its own key",
    ),
    Mutant(
        "attention.grouped_backward_sum.readable", "microtensor/ops/attention.py",
        "for h in range(g * group, (g + 1) * group):  # dK_g = sum_h dK^(h), dV_g = sum_h dV^(h)\n",
        "for h in range(g * group, (g + 1) * group):  # dK_g = sum_h dK^(h), dV_g = sum_h dV^(h)\n"
        "            grad_k[b, g, :, :] = 0\n"
        "            grad_v[b, g, :, :] = 0\n",
        gradcheck_cases("readable", "Attention"),
        why="the sum over the group dropped: each query head's dK, dV overwrite the previous head's, so a "
        "shared K/V head gets only its group's last head's gradient",
    ),
    Mutant(
        "attention.alibi_sign.readable", "microtensor/ops/attention.py",
        "s = dot * scale - slope * distance",
        "s = dot * scale + slope * distance",
        'tests/ops/test_attention.py -k "alibi and readable"',
        why="the ALiBi bias added instead of subtracted: far keys favoured over near ones (the gradients "
        "stay consistent with the wrong forward, so only a reference can tell)",
    ),
    # ----------------------------------------------------------------------------- elementwise ops
    Mutant(
        "relu.backward_at_zero", "microtensor/ops/elementwise.py",
        "np.where(x > 0, grad_out, 0)",
        "np.where(x >= 0, grad_out, 0)",
        'tests/test_exact_behaviour.py -k relu',
        why="the kink at exactly 0 passes the gradient (PyTorch's convention, and ours, is 0)",
    ),
    Mutant(
        "mul.backward", "microtensor/ops/elementwise.py",
        "grad_a = unbroadcast(grad_out * b, a.shape)",
        "grad_a = unbroadcast(grad_out * a, a.shape)",
        gradcheck_cases("readable", "Mul"),
    ),
    Mutant(
        "div.backward_sign", "microtensor/ops/elementwise.py",
        "grad_b = unbroadcast(-grad_out * y / b, b.shape)",
        "grad_b = unbroadcast(grad_out * y / b, b.shape)",
        gradcheck_cases("readable", "Div"),
    ),
    Mutant(
        "pow.backward_exponent", "microtensor/ops/elementwise.py",
        "dy_da = np.where(b == 0, zero, b * a ** (b - 1))",
        "dy_da = np.where(b == 0, zero, b * a ** b)",
        gradcheck_cases("readable", "Pow"),
    ),
    Mutant(
        "sub.backward_sign", "microtensor/ops/elementwise.py",
        "-unbroadcast(grad_out, b_shape)",
        "unbroadcast(grad_out, b_shape)",
        gradcheck_cases("readable", "Sub"),
    ),
    Mutant(
        "exp.backward", "microtensor/ops/elementwise.py",
        "return grad_out * y\n",
        "return grad_out\n",
        gradcheck_cases("readable", "Exp"),
    ),
    Mutant(
        "log.backward", "microtensor/ops/elementwise.py",
        "return grad_out / x",
        "return grad_out * x",
        gradcheck_cases("readable", "Log"),
    ),
    Mutant(
        "sqrt.backward", "microtensor/ops/elementwise.py",
        "return grad_out / (2 * y)",
        "return grad_out / y",
        gradcheck_cases("readable", "Sqrt"),
    ),
    Mutant(
        "tanh.backward", "microtensor/ops/elementwise.py",
        "return grad_out * (1 - y * y)",
        "return grad_out * (1 - y)",
        gradcheck_cases("readable", "Tanh"),
    ),
    Mutant(
        "sigmoid.backward", "microtensor/ops/elementwise.py",
        "return grad_out * y * (1 - y)",
        "return grad_out * (1 - y)",
        gradcheck_cases("readable", "Sigmoid"),
    ),
    Mutant(
        "dropout.backward", "microtensor/ops/dropout.py",
        "return grad_out * scaled_mask, None, None",
        "return grad_out, None, None",
        gradcheck_cases("readable", "Dropout"),
        why="the dropped elements get a gradient, and the kept ones miss the 1/(1-p)",
    ),
    Mutant(
        "rope.backward_direction", "microtensor/ops/electives/rope.py",
        "return _rotate(grad_out, cos, -sin), None",
        "return _rotate(grad_out, cos, sin), None",
        gradcheck_cases("readable", "RoPE"),
        why="backward rotates by +angle instead of the inverse rotation (-angle)",
    ),
    # ----------------------------------------------------------------------------- reductions
    Mutant(
        "sum.backward_keeps_dims", "microtensor/ops/reduce.py",
        "return _expand_to_input(grad_out, ctx.axes, ctx.keepdim, ctx.shape), None, None",
        "return _expand_to_input(grad_out, ctx.axes, True, ctx.shape), None, None",
        "tests/test_exact_behaviour.py -k sum_mean",
        why="the reduced dims are not put back before broadcasting, so g lands along the wrong axes",
    ),
    Mutant(
        "mean.backward_count", "microtensor/ops/reduce.py",
        "ctx.count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))",
        "ctx.count = int(x.shape[axes[0]])",
        gradcheck_cases("readable", "Mean"),
        why="a mean over several dims divides the gradient by the size of the first one only",
    ),
    Mutant(
        "max.backward_ties", "microtensor/ops/reduce.py",
        "np.where(is_max, grad / ties.astype(x.dtype), x.dtype.type(0))",
        "np.where(is_max, grad, x.dtype.type(0))",
        gradcheck_cases("readable", "Max"),
        why="every tied maximum gets the whole gradient instead of an even share",
    ),
    # ----------------------------------------------------------------------------- shape ops
    Mutant(
        "reshape.backward", "microtensor/ops/shape.py",
        "return grad_out.reshape(ctx.input_shape), None",
        "return grad_out.reshape(ctx.input_shape[::-1]).T, None",
        gradcheck_cases("readable", "Reshape"),
        why="the gradient gets the input's shape by a transpose: the right shape, the elements in the wrong places",
    ),
    Mutant(
        "permute.backward_inverse", "microtensor/ops/shape.py",
        "np.transpose(grad_out, np.argsort(ctx.dims))",
        "np.transpose(grad_out, ctx.dims)",
        "tests/test_exact_behaviour.py -k permute",
        why="backward applies the permutation again instead of its inverse (the same for a permutation that is its own inverse)",
    ),
    Mutant(
        "getitem.backward_repeated_indices", "microtensor/ops/shape.py",
        "np.add.at(grad, ctx.index, grad_out)  # repeated indices accumulate",
        "grad[ctx.index] = grad_out  # repeated indices accumulate",
        gradcheck_cases("readable", "GetItem"),
        why="an element picked twice keeps one gradient instead of the sum",
    ),
    Mutant(
        "concat.backward_order", "microtensor/ops/shape.py",
        "return tuple(np.split(grad_out, ctx.boundaries, axis=ctx.dim))",
        "return tuple(np.split(grad_out, ctx.boundaries, axis=ctx.dim)[::-1])",
        "tests/test_exact_behaviour.py -k concat",
        why="the pieces of the gradient handed to the inputs in reverse order",
    ),
    Mutant(
        "stack.backward_dim", "microtensor/ops/shape.py",
        "return tuple(np.moveaxis(grad_out, ctx.dim, 0))",
        "return tuple(np.moveaxis(grad_out, -1, 0))",
        "tests/test_exact_behaviour.py -k stack",
        why="the gradient split along the last dim instead of the stacking dim (the same when stacking along the last dim)",
    ),
    Mutant(
        "masked_fill.backward", "microtensor/ops/shape.py",
        "return np.where(mask, grad_out.dtype.type(0), grad_out), None, None",
        "return grad_out, None, None",
        gradcheck_cases("readable", "MaskedFill"),
        why="the filled positions, which no longer depend on x, still pass a gradient to it",
    ),
    Mutant(
        "where.backward_b", "microtensor/ops/shape.py",
        "grad_b = unbroadcast(np.where(condition, zero, grad_out), b_shape)",
        "grad_b = unbroadcast(np.where(condition, grad_out, zero), b_shape)",
        gradcheck_cases("readable", "Where"),
        why="b gets the gradient where the condition picked a",
    ),
    # ----------------------------------------------------------------------------- the engine
    Mutant(
        "engine.accumulate_two_paths", "microtensor/autograd.py",
        "grads[key] = grads[key] + input_grad",
        "grads[key] = input_grad",
        "tests/test_engine.py",
        why="a tensor reached along two paths keeps the gradient of the last one",
    ),
    Mutant(
        "engine.unbroadcast_mean", "microtensor/autograd.py",
        "return grad.sum(axis=axes, keepdims=True).reshape(shape)",
        "return grad.mean(axis=axes, keepdims=True).reshape(shape)",
        "tests/test_engine.py",
        why="the copies made by broadcasting averaged instead of summed",
    ),
    Mutant(
        "engine.topological_order_preorder", "microtensor/autograd.py",
        "        visited.add(id(tensor))\n        stack.append((tensor, True))\n",
        "        visited.add(id(tensor))\n        order.insert(0, tensor)\n",
        "tests/test_engine.py",
        why="depth-first pre-order instead of post-order: a tensor can be passed on before all its consumers have added their gradients",
    ),
    Mutant(
        "engine.leaf_gradients_across_backward_calls", "microtensor/autograd.py",
        "    held += grad\n",
        "    tensor.grad = grad\n",
        "tests/test_engine.py",
        why="a second backward replaces .grad instead of adding to it",
    ),
    Mutant(
        "engine.leaf_gradient_shared", "microtensor/autograd.py",
        "tensor.grad = active(copy_gradient)(grad)",
        "tensor.grad = grad",
        "tests/test_engine.py",
        why="a leaf's .grad is the very array another op or leaf holds, so adding into one changes the other",
    ),
    # ----------------------------------------------------------------------------- gradcheck itself
    Mutant(
        "gradcheck.nan_backward_passes", "microtensor/gradcheck.py",
        "            if not math.isfinite(ratio):\n                ratio = math.inf\n",
        "",
        "tests/test_gradcheck.py -k nan",
        why="a NaN error compares False with everything, so a backward returning NaN passes",
    ),
    Mutant(
        "gradcheck.difference_quotient_sign", "microtensor/gradcheck.py",
        "numeric = (plus - minus) / (2 * eps)",
        "numeric = (minus - plus) / (2 * eps)",
        "tests/test_gradcheck.py",
    ),
    Mutant(
        "gradcheck.upstream_ones", "microtensor/gradcheck.py",
        "upstream = rng.standard_normal(out.shape).astype(out.dtype)",
        "upstream = np.ones(out.shape, dtype=out.dtype)",
        "tests/test_gradcheck.py",
        why="checks fn(x).sum() only, which a zero backward passes for softmax",
    ),
    Mutant(
        "gradcheck.first_input_only", "microtensor/gradcheck.py",
        "    for i in checked:\n        x = inputs[i]\n        analytic_grad",
        "    for i in checked[:1]:\n        x = inputs[i]\n        analytic_grad",
        "tests/test_gradcheck.py",
        why="only the first input's gradient is compared",
    ),
    Mutant(
        "gradcheck.tolerance_doubled", "microtensor/gradcheck.py",
        "if worst is not None and worst[0] > 1:",
        "if worst is not None and worst[0] > 2:",
        "tests/test_exact_behaviour.py -k gradcheck_tolerance",
        why="an error up to twice atol + rtol |numeric| passes",
    ),
    # ----------------------------------------------------------------------------- optimizers
    Mutant(
        "sgd.momentum_dampened", "microtensor/optim.py",
        "momentum_buffer[i] = momentum * momentum_buffer[i] + g",
        "momentum_buffer[i] = momentum * momentum_buffer[i] + (1 - momentum) * g",
        "tests/test_optim.py -k sgd",
        why="an exponential average (dampening) where PyTorch's SGD adds the whole gradient",
    ),
    Mutant(
        "sgd.weight_decay_dropped", "microtensor/optim.py",
        "g = grad[i] + weight_decay * param[i]",
        "g = grad[i]",
        "tests/test_optim.py -k sgd",
    ),
    Mutant(
        "adam.first_moment", "microtensor/optim.py",
        "m[i] = beta1 * m[i] + (one - beta1) * g",
        "m[i] = beta1 * m[i] + g",
        "tests/test_optim.py -k first_three_steps",
    ),
    Mutant(
        "adam.second_moment_beta1", "microtensor/optim.py",
        "v[i] = beta2 * v[i] + (one - beta2) * g * g",
        "v[i] = beta1 * v[i] + (one - beta1) * g * g",
        "tests/test_optim.py -k first_three_steps",
        why="the second moment averaged with beta1",
    ),
    Mutant(
        "adam.bias_correction_not_updated", "microtensor/optim.py",
        "real(1 - beta1**t), real(1 - beta2**t)",
        "real(1 - beta1**t), real(1 - beta2)",
        "tests/test_optim.py -k first_three_steps",
        why="v's bias correction stuck at its first step's value",
    ),
    Mutant(
        "adam.eps_inside_sqrt", "microtensor/optim.py",
        "np.sqrt(v_hat) + eps",
        "np.sqrt(v_hat + eps)",
        "tests/test_optim.py -k first_three_steps",
    ),
    Mutant(
        "adamw.decay_coupled", "microtensor/optim.py",
        'weight_decay, l2 = group["weight_decay"], 0.0',
        'weight_decay, l2 = 0.0, group["weight_decay"]',
        "tests/test_optim.py -k first_three_steps",
        why="AdamW's weight decay goes through the gradient (Adam's L2) instead of straight to the weights",
    ),
    Mutant(
        "adamw.decay_without_lr", "microtensor/optim.py",
        "param[i] -= lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * param[i])",
        "param[i] -= lr * m_hat / (np.sqrt(v_hat) + eps) + weight_decay * param[i]",
        "tests/test_optim.py -k first_three_steps",
        why="the decoupled decay not multiplied by the learning rate",
    ),
    # ----------------------------------------------------------------------------- schedule and clipping
    Mutant(
        "schedule.warmup_starts_at_zero", "microtensor/optim.py",
        "return max_lr * (step + 1) / (warmup_iters + 1)",
        "return max_lr * step / warmup_iters",
        "tests/test_optim.py -k cosine",
    ),
    Mutant(
        "schedule.cosine_quarter_period", "microtensor/optim.py",
        "math.cos(math.pi * ratio)",
        "math.cos(0.5 * math.pi * ratio)",
        "tests/test_optim.py -k cosine",
        why="the decay ends half way down the cosine, at the midpoint of max_lr and min_lr",
    ),
    Mutant(
        "clip.scales_up_small_gradients", "microtensor/optim.py",
        "if scale < 1.0:",
        "if scale != 1.0:",
        "tests/test_optim.py -k clip",
        why="gradients below max_norm are scaled up to it",
    ),
    Mutant(
        "clip.l1_norm", "microtensor/optim.py",
        "float(np.vdot(g, g))",
        "float(np.abs(g).sum())",
        "tests/test_optim.py -k clip",
        why="the squares of the L2 norm replaced by absolute values",
    ),
    # ----------------------------------------------------------------------------- the model
    Mutant(
        "gpt.tied_head_detached", "gpt/model/transformer.py",
        "logits = x @ wte.weight.T if isinstance(wte, nn.Embedding)",
        "logits = x @ wte.weight.detach().T if isinstance(wte, nn.Embedding)",
        'tests/test_gpt.py -k "test_every_parameter_gradient and learned-True"',
        jit=True,
        why="with tied weights the output layer's gradient never reaches wte",
    ),
    Mutant(
        "gpt.learned_positions_ignore_offset", "gpt/model/transformer.py",
        "mt.arange(offset, offset + T)",
        "mt.arange(0, T)",
        'tests/test_gpt.py -k "cache_and_an_offset and learned"',
        jit=True,
        why="with a KV cache every new token gets position 0",
    ),
    Mutant(
        "gpt.rope_ignores_offset", "gpt/model/transformer.py",
        "q, k = F.rope(q, offset), F.rope(k, offset)",
        "q, k = F.rope(q, 0), F.rope(k, 0)",
        'tests/test_gpt.py -k "cache_and_an_offset and rope"',
        jit=True,
        why="with a KV cache every new token is rotated as position 0",
    ),
    Mutant(
        "gpt.generation_offset", "gpt/generation/decoder.py",
        "logits = model(new_tokens, caches=self.caches, offset=self.fed)[0].data",
        "logits = model(new_tokens, caches=self.caches, offset=0)[0].data",
        'tests/test_gpt.py -k "test_cached_generation and readable and learned"',
        jit=True,
        why="generation through the modules passes no offset: the new tokens' positions restart at 0",
    ),
    Mutant(
        "gpt.kv_cache_stores_values_as_keys", "gpt/model/transformer.py",
        "self.k[:, :, self.length : self.length + T] = k.data",
        "self.k[:, :, self.length : self.length + T] = v.data",
        'tests/test_gpt.py -k "test_cached_generation and readable"',
        jit=True,
    ),
    Mutant(
        "gpt.window_jumps_at_block_size", "gpt/generation/decoder.py",
        "if length - start <= block_size:",
        "if length - start < block_size:",
        'tests/test_gpt.py -k "window_of_the_rule and learned"',
        jit=True,
        why="the window moves on when it holds exactly block_size tokens, which still fit (the cached and "
        "uncached paths share the rule, so comparing them cannot see it)",
    ),
    Mutant(
        "gpt.window_keeps_too_few", "gpt/generation/decoder.py",
        "return length - max(1, block_size // 2)",
        "return length - max(1, block_size // 2 - 1)",
        'tests/test_gpt.py -k "window_of_the_rule and learned"',
        jit=True,
        why="after a jump the window keeps block_size // 2 - 1 tokens",
    ),
    Mutant(
        "gpt.decode_position_off_by_one", "gpt/generation/decoder.py",
        "self.kernel.decode(self.kernel_weights, new_tokens[:, 0], self.fed, self.keys, self.values)",
        "self.kernel.decode(self.kernel_weights, new_tokens[:, 0], self.fed - 1, self.keys, self.values)",
        'tests/test_gpt.py -k "test_cached_generation and fast and layernorm-gelu-learned"',
        jit=True,
        why="the fast one-token step writes over the previous token's cache entry and takes its position",
    ),
    Mutant(
        "sample.greedy_argmin", "gpt/generation/sampling.py",
        "return logits.argmax(axis=-1)",
        "return logits.argmin(axis=-1)",
        "tests/test_gpt.py -k sampling",
        jit=True,
    ),
    Mutant(
        "sample.top_k_keeps_one_more", "gpt/generation/sampling.py",
        "kth = np.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])][:, None]",
        "kth = np.sort(logits, axis=-1)[:, -min(top_k + 1, logits.shape[-1])][:, None]",
        "tests/test_gpt.py -k top_k_keeps",
        jit=True,
    ),
    Mutant(
        "sample.top_p_drops_the_crossing_token", "gpt/generation/sampling.py",
        "keep_sorted = above < top_p",
        "keep_sorted = above + sorted_probs < top_p",
        "tests/test_gpt.py -k top_p_keeps",
        jit=True,
        why="the token whose probability carries the total past top_p is dropped, so the kept set may not reach top_p",
    ),
    Mutant(
        "sample.temperature_multiplies", "gpt/generation/sampling.py",
        "logits = logits / temperature",
        "logits = logits * temperature",
        "tests/test_gpt.py -k divided_by_the_temperature",
        jit=True,
    ),
    Mutant(
        "convert.sha256_not_compared", "gpt/checkpoints/convert.py",
        "changed = [name for name in recorded if name in tensors and tensor_sha256(tensors[name]) != recorded[name]]",
        "changed = []",
        'tests/test_convert.py -k "flipped or checksums"',
        jit=True,
        why="the export's per-tensor sha256 read but never compared: a flipped byte imports as other logits",
    ),
    Mutant(
        "convert.overlap_test_reversed", "gpt/checkpoints/convert.py",
        "        if begin < end:\n",
        "        if begin > end:\n",
        "tests/test_convert.py -k overlap",
        jit=True,
        why="a tensor whose bytes begin inside the one before passes: two names read the same bytes, one weight is lost",
    ),
    # ----------------------------------------------------------------------------- fast twins (compiled)
    Mutant(
        "softmax.backward.fast", "microtensor/fast/softmax.py",
        'kernel(parallel=True, fastmath=REDUCE_FASTMATH, tag="fast")(readable.softmax_backward)',
        'kernel(parallel=True, fastmath=REDUCE_FASTMATH, tag="fast")(readable.log_softmax_backward)',
        gradcheck_cases("fast", "Softmax-softmax"),
        jit=True,
        why="the fast twin registered from the wrong readable kernel (log-softmax's backward, same arguments)",
    ),
    Mutant(
        "log_softmax.backward.fast", "microtensor/fast/softmax.py",
        "grad_x[r, c] = grad_z[r, c] - exp_of_nonpositive(z[r, c]) * total",
        "grad_x[r, c] = grad_z[r, c] - exp_of_nonpositive(z[r, c])",
        gradcheck_cases("fast", "LogSoftmax"),
        jit=True,
    ),
    Mutant(
        "cross_entropy.saved_inverse_total.fast", "microtensor/fast/cross_entropy.py",
        "inverse_total[n] = one / total",
        "inverse_total[n] = total",
        gradcheck_cases("fast", "CrossEntropy"),
        jit=True,
        why="forward saves the sum of exponentials instead of its inverse: the loss is right, backward's probabilities are not",
    ),
    Mutant(
        "layer_norm.backward_input.fast", "microtensor/ops/layer_norm.py",
        "grad_x[n, c] = r * (grad_out[n, c] * weight[c] - d_mean - xhat * d_xhat_mean)",
        "grad_x[n, c] = r * (grad_out[n, c] * weight[c] - xhat * d_xhat_mean)",
        gradcheck_cases("fast", "LayerNorm"),
        jit=True,
        why="the fast twin is the readable loop compiled with other flags: an edit of the loop must reach it "
        "(and the source-keyed cache must not serve the old one)",
    ),
    Mutant(
        "rms_norm.backward_input.fast", "microtensor/ops/electives/rms_norm.py",
        "grad_x[n, c] = r * (grad_out[n, c] * weight[c] - x[n, c] * r * d_xhat_mean)",
        "grad_x[n, c] = r * grad_out[n, c] * weight[c]",
        gradcheck_cases("fast", "RMSNorm"),
        jit=True,
        why="as layer_norm.backward_input.fast",
    ),
    Mutant(
        "gelu.tanh_backward.fast", "microtensor/fast/gelu.py",
        "* k * (one + three * a * xi * xi)",
        "* k * (one + a * xi * xi)",
        gradcheck_cases("fast", "GELU"),
        jit=True,
    ),
    Mutant(
        "gelu.erf_backward.fast", "microtensor/fast/gelu.py",
        "grad_x[i] = grad_out[i] * (cdf + xi * pdf)",
        "grad_x[i] = grad_out[i] * cdf",
        gradcheck_cases("fast", "GELU"),
        jit=True,
    ),
    Mutant(
        "silu.saved_sigmoid.fast", "microtensor/fast/electives/silu.py",
        "sigmoid_x[i] = s",
        "sigmoid_x[i] = x[i] * s",
        gradcheck_cases("fast", "SiLU"),
        jit=True,
        why="forward saves silu(x) where backward expects σ(x)",
    ),
    Mutant(
        "swiglu.backward_value.fast", "microtensor/fast/electives/silu.py",
        "grad_b[i] = grad_out[i] * a[i] * s",
        "grad_b[i] = grad_out[i] * s",
        gradcheck_cases("fast", "SwiGLU"),
        jit=True,
    ),
    Mutant(
        "matmul.backward_b.fast", "microtensor/fast/matmul.py",
        "products.append((a.T, grad, grad_b))",
        "products.append((a.T[::-1], grad, grad_b))",
        gradcheck_cases("fast", "MatMul"),
        jit=True,
        why="dB = Aᵀ g with the rows of Aᵀ in reverse order",
    ),
    Mutant(
        "attention.backward_scale.fast", "microtensor/fast/attention.py",
        "dp[i, j] = p[i, j] * (dp[i, j] - row_dot[i]) * scale",
        "dp[i, j] = p[i, j] * (dp[i, j] - row_dot[i])",
        gradcheck_cases("fast", "Attention"),
        jit=True,
        why="the 1/√D missing from dS in the fast backward",
    ),
    Mutant(
        "attention.causal_mask.fast", "microtensor/fast/attention.py",
        "for j in range(Tk - Tq + i + 1, Tk):",
        "for j in range(Tk - Tq + i + 2, Tk):",
        'tests/ops/test_attention.py -k "against_reference and fast"',
        jit=True,
        why="each query also sees the next key",
    ),
    Mutant(
        "attention.grouped_backward_sum.fast", "microtensor/fast/attention.py",
        "add = n > kv * group  # dk_g = sum over the group's heads of dSᵀ q, dv_g likewise",
        "add = False  # dk_g = sum over the group's heads of dSᵀ q, dv_g likewise",
        gradcheck_cases("fast", "Attention"),
        jit=True,
        why="every head of a group writes dk_g and dv_g (BLAS's beta = 0) instead of adding to them: "
        "the last head's gradient only",
    ),
    Mutant(
        "attention.alibi_sign.fast", "microtensor/fast/attention.py",
        "s[i, j] = s[i, j] * scale - slope * s.dtype.type(abs(position - j))",
        "s[i, j] = s[i, j] * scale + slope * s.dtype.type(abs(position - j))",
        'tests/ops/test_attention.py -k "alibi and fast"',
        jit=True,
        why="the ALiBi bias added instead of subtracted in the fast forward",
    ),
    Mutant(
        "engine.copy_gradient.fast", "microtensor/fast/memory.py",
        "        destination[i] = source[i]\n",
        "        destination[i] = abs(source[i])\n",
        "tests/test_engine.py",
        jit=True,
        why="the fast copy of a leaf's first gradient into .grad drops the signs",
    ),
    Mutant(
        "decode.tied_head", "gpt/generation/decode_kernel.py",
        "lm_head = parts.wte.weight.data.T if config.tie_weights else",
        "lm_head = parts.wte.weight.data.T if config.tie_weights or config.bias else",
        'tests/test_gpt.py -k "test_decode_step and layernorm-gelu-learned-True-False"',
        jit=True,
        why="the one-token step uses wteᵀ as the output layer of an untied model (with biases)",
    ),
    Mutant(
        "decode.learned_position", "gpt/generation/decode_kernel.py",
        "x[c] += w.wpe[position, c]",
        "x[c] += w.wpe[position - 1, c]",
        'tests/test_gpt.py -k "test_decode_step and layernorm-gelu-learned-False-True"',
        jit=True,
        why="the new token gets the previous position's embedding",
    ),
    Mutant(
        "decode.attention_excludes_the_new_token", "gpt/generation/decode_kernel.py",
        "n, D = position + 1, keys.shape[1]",
        "n, D = position, keys.shape[1]",
        'tests/test_gpt.py -k "test_decode_step and layernorm-gelu-learned-False-True"',
        jit=True,
        why="the new token attends to the cached positions but not to itself",
    ),
    Mutant(
        "decode.grouped_head", "gpt/generation/decode_kernel.py",
        "g = h // group  # the key/value head of h's group",
        "g = h % Hk  # the key/value head of h's group",
        'tests/electives/test_decode_variants.py -k "float64"',
        jit=True,
        why="the one-token step pairs query heads with the wrong shared key/value heads",
    ),
    Mutant(
        "decode.alibi_sign", "gpt/generation/decode_kernel.py",
        "s = s * scale - slope * keys.dtype.type(position - j)",
        "s = s * scale + slope * keys.dtype.type(position - j)",
        'tests/electives/test_decode_variants.py -k "float64"',
        jit=True,
        why="ALiBi rewards distance instead of penalizing it in the one-token step",
    ),
    Mutant(
        "decode.expert_ties", "gpt/generation/decode_kernel.py",
        "probs[e] > probs[best]",
        "probs[e] >= probs[best]",
        "tests/electives/test_decode_variants.py -k equal_probabilities",
        jit=True,
        why="experts tied in probability go to the higher number, unlike the module",
    ),
    Mutant(
        "decode.lora_layer_says_yes", "gpt/model/electives/lora.py",
        "fits_decode_kernel = False",
        "fits_decode_kernel = True",
        "tests/test_decoding.py -k unmerged_lora_adapters",
        jit=True,
        why="a LoRA layer lets the one-token kernel run it, which reads the base weight and drops the adapter",
    ),
]
