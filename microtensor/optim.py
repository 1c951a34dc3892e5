"""Optimizers (SGD, Adam, AdamW), gradient clipping, and the learning-rate schedule.

    optimizer = AdamW(weight_decay_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99))
    for step in range(max_iters):
        for group in optimizer.param_groups:
            group["lr"] = cosine_with_warmup(step, 1e-3, 1e-4, 100, max_iters)
        loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm(model.parameters(), 1.0)
        optimizer.step()

An optimizer holds `param_groups`: a list of dicts, each with "params" (a list of Parameters) and the
hyperparameters used for them ("lr", "weight_decay", ...; any left out take the optimizer's defaults).
Pass either a list of Parameters (one group) or a list of such dicts, as in PyTorch. A learning-rate
schedule simply sets `group["lr"]` before each step. `optimizer.state[param]` holds what the optimizer
remembers about one Parameter between steps (for Adam: the step count t and the moments m and v).

`step()` updates every Parameter that has a gradient, in place, with one call of a fused kernel per
Parameter (`sgd_update`, `adamw_update`: one loop over the elements, each read and written once), and
float32 stays float32 (the hyperparameters are converted to the Parameter's dtype before the call).
The kernels divide with numpy's rules (kernels.kernel's error_model="numpy": a division by zero
gives inf or nan instead of raising), which also leaves the loop free of checks, so that it vectorizes.
"""
import math

import numpy as np

from .kernels import active, kernel
from .tensor import FLOAT_DTYPES, Tensor

# ================================================================================= kernels


@kernel
def sgd_update(param, grad, momentum_buffer, lr, momentum, weight_decay):
    """One SGD step with momentum, in place, over flat (N,) arrays of one dtype:

        g = grad + weight_decay * param          (weight decay as an L2 term in the loss)
        momentum_buffer = momentum * momentum_buffer + g
        param = param - lr * momentum_buffer

    With momentum = 0 this is plain SGD, param -= lr * g. The buffer starts at zeros, so the first
    step's buffer is exactly g (as in PyTorch).
    """
    for i in range(param.shape[0]):
        g = grad[i] + weight_decay * param[i]
        momentum_buffer[i] = momentum * momentum_buffer[i] + g
        param[i] -= lr * momentum_buffer[i]


@kernel
def adamw_update(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, l2, bias_correction1, bias_correction2):
    """One Adam/AdamW step, in place, over flat (N,) arrays of one dtype (t counts the steps from 1):

        g     = grad + l2 * param                    (Adam's weight decay: an L2 term in the loss)
        m     = beta1 * m + (1 - beta1) * g          (running mean of the gradient)
        v     = beta2 * v + (1 - beta2) * g * g      (running mean of its square)
        m_hat = m / (1 - beta1^t)                    (bias correction: m and v start at 0, so early
        v_hat = v / (1 - beta2^t)                     averages are too small by exactly these factors)
        param = param - lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * param)

    The last term is AdamW's decoupled weight decay: it shrinks the weights directly instead of going
    through m and v, where Adam's l2 term gets divided by sqrt(v_hat) like the rest of the gradient.
    Adam calls this with weight_decay = 0, AdamW with l2 = 0. bias_correction1 = 1 - beta1^t and
    bias_correction2 = 1 - beta2^t are computed by the caller. Every scalar has the arrays' dtype.
    """
    one = param.dtype.type(1)
    for i in range(param.shape[0]):
        g = grad[i] + l2 * param[i]
        m[i] = beta1 * m[i] + (one - beta1) * g
        v[i] = beta2 * v[i] + (one - beta2) * g * g
        m_hat = m[i] / bias_correction1
        v_hat = v[i] / bias_correction2
        param[i] -= lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * param[i])


# ================================================================================= optimizers


class Optimizer:
    """Base class: param groups, state, zero_grad, and saving and loading the state.

    A subclass passes its hyperparameters' values (the defaults of every group) to `__init__`, sets
    `state_names` (what `state[param]` holds), and writes `_new_state(param)` and `step()`.
    """

    state_names = ()

    def __init__(self, params, defaults):
        name = type(self).__name__
        if isinstance(params, Tensor) or hasattr(params, "named_parameters"):
            raise TypeError(f"{name}: expected a list of Parameters, e.g. model.parameters(), got {type(params).__name__}")
        params = list(params)
        if not params:
            raise ValueError(f"{name}: got an empty list of parameters")
        self.defaults = defaults
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = []
        seen = set()
        for index, group in enumerate(groups):
            if not isinstance(group, dict):
                raise TypeError(f"{name}: pass either a list of Parameters or a list of param-group dicts, not a mix")
            unknown = [key for key in group if key not in self.defaults and key not in ("params", "name")]
            if unknown:
                raise ValueError(
                    f"{name}: param group {index} has unknown keys {unknown}; "
                    f"the known keys are: params, name, {', '.join(self.defaults)}"
                )
            if "params" not in group:
                raise ValueError(f"{name}: param group {index} has no 'params' key")
            group = {**self.defaults, **group, "params": list(group["params"])}
            if "betas" in group:
                group["betas"] = tuple(group["betas"])
            for param in group["params"]:
                if not isinstance(param, Tensor) or not param.requires_grad or param.dtype not in FLOAT_DTYPES:
                    raise TypeError(
                        f"{name}: param group {index} holds a {type(param).__name__} that is not a float "
                        "Tensor requiring a gradient (expected Parameters, e.g. from model.parameters())"
                    )
                if id(param) in seen:
                    raise ValueError(f"{name}: a Parameter of shape {param.shape} appears twice in the param groups")
                seen.add(id(param))
            self._check_hyperparameters(group)
            self.param_groups.append(group)
        self.state = {}  # Parameter -> {state name: value}; Tensors hash by identity

    def _check_hyperparameters(self, group):
        for key in ("lr", "weight_decay", "eps", "momentum"):
            if key in group and not group[key] >= 0:
                raise ValueError(f"{type(self).__name__}: {key} must be >= 0, got {group[key]}")
        if "betas" in group:
            beta1, beta2 = group["betas"]
            if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
                raise ValueError(f"{type(self).__name__}: betas must be in [0, 1), got {group['betas']}")

    def _params(self):
        """Every Parameter, in group order: position i here is `param.{i}` in the state dict."""
        return [param for group in self.param_groups for param in group["params"]]

    def zero_grad(self):
        """Forget the gradients (`.grad = None`) of every Parameter this optimizer updates."""
        for param in self._params():
            param.grad = None

    def _state(self, param):
        state = self.state.get(param)
        if state is None:
            state = self.state[param] = self._new_state(param)
        return state

    # ----------------------------------------------------------------------------- saving and loading
    def state_dict(self):
        """The optimizer's state as a flat dict of numpy arrays and numbers, ready for np.savez:

            "group.{g}.{hyperparameter}"  each group's hyperparameters (betas as an array of 2)
            "group.{g}.num_params"        how many Parameters group g holds
            "param.{i}.{name}"            the state of the i-th Parameter, counting through the groups
                                          in order (for Adam: step, m, v); absent before its first step
        """
        out = {}
        for g, group in enumerate(self.param_groups):
            for key, value in group.items():
                if key != "params":
                    out[f"group.{g}.{key}"] = np.array(value) if isinstance(value, tuple) else value
            out[f"group.{g}.num_params"] = len(group["params"])
        for i, param in enumerate(self._params()):
            for key, value in self.state.get(param, {}).items():
                out[f"param.{i}.{key}"] = value.copy() if isinstance(value, np.ndarray) else value
        return out

    def load_state_dict(self, state_dict):
        """Restore a `state_dict()` (also after np.savez / np.load). The groups must hold the same
        number of Parameters with the same shapes and dtypes; everything is checked before anything
        changes, and one error lists every problem."""
        name = type(self).__name__
        params = self._params()
        problems, used = [], set()
        groups = []
        for g, group in enumerate(self.param_groups):
            count_key = f"group.{g}.num_params"
            used.add(count_key)
            if count_key not in state_dict:
                problems.append(f"missing {count_key}")
            elif int(state_dict[count_key]) != len(group["params"]):
                problems.append(f"group {g} holds {len(group['params'])} params, the state dict {int(state_dict[count_key])}")
            values = {}
            for key, current in group.items():
                full_key = f"group.{g}.{key}"
                if key == "params":
                    continue
                used.add(full_key)
                if full_key not in state_dict:
                    problems.append(f"missing {full_key}")
                    continue
                value = state_dict[full_key]
                if isinstance(current, tuple):  # betas
                    values[key] = tuple(float(x) for x in np.asarray(value))
                elif isinstance(current, str):  # a group's optional "name"
                    values[key] = str(value)
                else:
                    values[key] = float(value)
            groups.append(values)
        states = {}
        for i, param in enumerate(params):
            present = [f"param.{i}.{key}" in state_dict for key in self.state_names]
            if not any(present):
                continue  # this Parameter had not been stepped yet
            if not all(present):
                problems.append(f"param {i}: expected all of {self.state_names}, some are missing")
                continue
            state = {}
            for key in self.state_names:
                full_key = f"param.{i}.{key}"
                used.add(full_key)
                value = np.asarray(state_dict[full_key])
                if key == "step":
                    if value.shape != () or value.dtype.kind not in "iu":
                        problems.append(f"{full_key} must be an integer, got {value.dtype} of shape {value.shape}")
                    else:
                        state[key] = int(value)
                elif value.shape != param.shape or value.dtype != param.dtype:
                    problems.append(
                        f"{full_key} has shape {value.shape} {value.dtype}, the Parameter {param.shape} {param.dtype}"
                    )
                else:
                    state[key] = np.array(value, order="C", copy=True)
            states[param] = state
        unexpected = [key for key in state_dict if key not in used]
        if unexpected:
            problems.append(f"unexpected keys: {', '.join(unexpected)}")
        if problems:
            raise RuntimeError(f"{name}.load_state_dict: nothing was loaded, because of\n  " + "\n  ".join(problems))
        for group, values in zip(self.param_groups, groups):
            group.update(values)
        self.state = states


def _flat(array):
    """The (N,) view of a C-contiguous array (a view, so the kernels write into the Parameter)."""
    return array.reshape(-1)


def _contiguous_data(param):
    # The kernels need a C-contiguous array to update in place; a Parameter made by nn always is,
    # but someone may have assigned e.g. a transposed array to param.data.
    if not param.data.flags.c_contiguous or not param.data.flags.writeable:
        param.data = np.array(param.data, order="C", copy=True)
    return param.data


class SGD(Optimizer):
    """Stochastic gradient descent with momentum and L2 weight decay (see `sgd_update`)."""

    state_names = ("momentum_buffer",)

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    def _new_state(self, param):
        return {"momentum_buffer": np.zeros(param.shape, dtype=param.dtype)}

    def step(self):
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                data = _contiguous_data(param)
                real = data.dtype.type  # np.float32 or np.float64: the scalars' dtype
                buffer = self._state(param)["momentum_buffer"]
                grad = np.ascontiguousarray(param.grad)
                active(sgd_update)(
                    _flat(data), _flat(grad), _flat(buffer),
                    real(group["lr"]), real(group["momentum"]), real(group["weight_decay"]),
                )  # fmt: skip


class Adam(Optimizer):
    """Adam (Kingma and Ba, 2014) with bias correction; weight_decay adds weight_decay * param to the
    gradient (an L2 penalty, as PyTorch's Adam does). For decoupled weight decay use AdamW."""

    state_names = ("step", "m", "v")
    decoupled_weight_decay = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def _new_state(self, param):
        return {"step": 0, "m": np.zeros(param.shape, dtype=param.dtype), "v": np.zeros(param.shape, dtype=param.dtype)}

    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            if self.decoupled_weight_decay:
                weight_decay, l2 = group["weight_decay"], 0.0
            else:
                weight_decay, l2 = 0.0, group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                data = _contiguous_data(param)
                real = data.dtype.type  # np.float32 or np.float64: the scalars' dtype
                state = self._state(param)
                state["step"] += 1
                t = state["step"]
                grad = np.ascontiguousarray(param.grad)
                active(adamw_update)(
                    _flat(data), _flat(grad), _flat(state["m"]), _flat(state["v"]),
                    real(group["lr"]), real(beta1), real(beta2), real(group["eps"]),
                    real(weight_decay), real(l2), real(1 - beta1**t), real(1 - beta2**t),
                )  # fmt: skip


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2017): each step also shrinks every
    weight by lr * weight_decay * param, outside the adaptive scaling (see `adamw_update`).
    Use `weight_decay_groups(model, weight_decay)` to decay only the matrices, as nanoGPT does."""

    decoupled_weight_decay = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def weight_decay_groups(params, weight_decay):
    """nanoGPT's two param groups: decay the matrices (ndim >= 2: Linear and Embedding weights), not
    the vectors (biases, LayerNorm and RMSNorm weights). `params` is a Module or its parameters().

        AdamW(weight_decay_groups(model, 0.1), lr=1e-3)
    """
    if hasattr(params, "parameters"):
        params = params.parameters()
    params = list(params)
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


# ================================================================================= clipping and schedule


def clip_grad_norm(params, max_norm):
    """Scale all gradients, in place, so that their global L2 norm is at most `max_norm`.

        total_norm = sqrt(sum over every gradient array g of sum(g * g))
        if total_norm > max_norm: every g *= max_norm / (total_norm + 1e-6)

    Parameters without a gradient are skipped. Returns total_norm before clipping (a Python float),
    worth logging: spikes show instabilities. A non-finite norm is returned and nothing is scaled.
    """
    grads = []
    for param in params:
        if not isinstance(param, Tensor):
            raise TypeError(f"clip_grad_norm: expected Parameters (e.g. model.parameters()), got {type(param).__name__}")
        if param.grad is not None:
            grads.append(param.grad)
    # np.vdot of an array with itself is its sum of squares, in one BLAS call and no temporary.
    total_norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads))
    scale = max_norm / (total_norm + 1e-6)
    if scale < 1.0:
        for g in grads:
            g *= scale  # in place keeps the dtype (float32 stays float32)
    return total_norm


def cosine_with_warmup(step, max_lr, min_lr, warmup_iters, lr_decay_iters):
    """The learning rate at `step` (counted from 0): a linear warmup, then a cosine decay to min_lr.

        step < warmup_iters:                     lr = max_lr * (step + 1) / (warmup_iters + 1)
        warmup_iters <= step <= lr_decay_iters:  r  = (step - warmup_iters) / (lr_decay_iters - warmup_iters)
                                                 lr = min_lr + 0.5 * (1 + cos(pi * r)) * (max_lr - min_lr)
        step > lr_decay_iters:                   lr = min_lr

    The same values as nanoGPT's `get_lr`. The warmup never uses lr = 0 (its first step is
    max_lr / (warmup_iters + 1)), reaches max_lr at step = warmup_iters (where r = 0), and the
    cosine ends at min_lr at step = lr_decay_iters. If lr_decay_iters == warmup_iters there is no
    decay phase: min_lr from step warmup_iters on.
    """
    if lr_decay_iters < warmup_iters:
        raise ValueError(f"cosine_with_warmup: lr_decay_iters ({lr_decay_iters}) must be >= warmup_iters ({warmup_iters})")
    if step < warmup_iters:
        return max_lr * (step + 1) / (warmup_iters + 1)
    if step > lr_decay_iters or lr_decay_iters == warmup_iters:
        return min_lr
    ratio = (step - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)
