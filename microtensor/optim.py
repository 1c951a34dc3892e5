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
from collections.abc import Mapping

import numpy as np

from .checks import FLOAT_DTYPES, as_count, as_real
from .errors import InputError, InputTypeError, StateDictError
from .kernels import active, kernel
from .tensor import Tensor

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


# ================================================================================= checks


# What each hyperparameter may be, as (test on a float, the words of the error). A learning rate
# of inf or nan, a beta of 1 or more (the running means would never forget, or grow without
# bound), or an eps of 0 (a division by zero where v is 0) would each turn the weights into
# nan or inf a few steps later, far from the mistake: they are refused where they are set.
HYPERPARAMETER_RULES = {
    "lr": (lambda x: math.isfinite(x) and x >= 0, "must be >= 0 and finite"),
    "weight_decay": (lambda x: math.isfinite(x) and x >= 0, "must be >= 0 and finite"),
    "momentum": (lambda x: 0 <= x < 1, "must be in [0, 1)"),
    "eps": (lambda x: math.isfinite(x) and x > 0, "must be > 0 and finite"),
}


def _hyperparameter_problem(key, value):
    """What is wrong with `value` as hyperparameter `key`: (the error's class, a sentence), or None."""
    if key == "betas":
        pair = None
        if isinstance(value, (tuple, list, np.ndarray)) and np.shape(value) == (2,):
            pair = [as_real(x) for x in value]
        if pair is None or None in pair:
            return InputTypeError, f"betas must be a pair of numbers (beta1, beta2), got {value!r}"
        if not all(0 <= beta < 1 for beta in pair):
            return InputError, f"betas must be in [0, 1), got {tuple(pair)}"
        return None
    if key == "name":
        return None if isinstance(value, str) else (InputTypeError, f"name must be a str, got {type(value).__name__}")
    if key not in HYPERPARAMETER_RULES:
        return None  # a key the user added to a group after construction (say a schedule's note)
    rule, words = HYPERPARAMETER_RULES[key]
    number = as_real(value)
    if number is None:
        return InputTypeError, f"{key} must be a number, got {type(value).__name__} {value!r}"
    if not rule(number):
        return InputError, f"{key} {words}, got {value}"
    return None


# ================================================================================= optimizers


class Optimizer:
    """Base class: param groups, state, zero_grad, and saving and loading the state.

    A subclass passes its hyperparameters' values (the defaults of every group) to `__init__`, sets
    `state_names` (what `state[param]` holds), and writes `_new_state(param)` and `step()`.

    Every hyperparameter is checked where it enters: in the constructor, for each param group, in
    `load_state_dict`, and at each `step()` (a schedule sets `group["lr"]` between steps). Each
    `step()` also checks, before any kernel runs and before any weight changes, that every
    Parameter's `.grad` is an array of the Parameter's shape and dtype, and that the state kept for
    it still fits `.data`: the kernels index without bounds checks, so a mismatch would read or
    write outside an array.
    """

    state_names = ()

    def __init__(self, params, defaults):
        name = type(self).__name__
        if isinstance(params, Tensor) or hasattr(params, "named_parameters"):
            raise InputTypeError(
                f"{name}: expected a list of Parameters, e.g. model.parameters(), got {type(params).__name__}"
            )
        if isinstance(params, (Mapping, str)):
            raise InputTypeError(
                f"{name}: expected a list of Parameters or a list of param-group dicts, got a {type(params).__name__}"
                + ("; put a single param group in a list: [group]" if isinstance(params, Mapping) else "")
            )
        try:
            params = list(params)
        except TypeError:
            raise InputTypeError(
                f"{name}: expected a list of Parameters, e.g. model.parameters(), got {type(params).__name__}"
            ) from None
        if not params:
            raise InputError(f"{name}: got an empty list of parameters")
        for key, value in defaults.items():
            self._raise_if_bad(f"{name}", key, value)
        self.defaults = defaults
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = []
        seen = set()
        for index, group in enumerate(groups):
            if not isinstance(group, dict):
                raise InputTypeError(f"{name}: pass either a list of Parameters or a list of param-group dicts, not a mix")
            unknown = [key for key in group if key not in self.defaults and key not in ("params", "name")]
            if unknown:
                raise InputError(
                    f"{name}: param group {index} has unknown keys {unknown}; "
                    f"the known keys are: params, name, {', '.join(self.defaults)}"
                )
            if "params" not in group:
                raise InputError(f"{name}: param group {index} has no 'params' key")
            group_params = group["params"]
            # A single Parameter as a group's params is one Parameter (as in PyTorch), not its rows.
            group_params = [group_params] if isinstance(group_params, Tensor) else list(group_params)
            group = {**self.defaults, **group, "params": group_params}
            if "betas" in group:
                self._raise_if_bad(f"{name}: param group {index}", "betas", group["betas"])
                group["betas"] = tuple(float(beta) for beta in group["betas"])
            for param in group["params"]:
                if not isinstance(param, Tensor) or not param.requires_grad or param.dtype not in FLOAT_DTYPES:
                    raise InputTypeError(
                        f"{name}: param group {index} holds a {type(param).__name__} that is not a float "
                        "Tensor requiring a gradient (expected Parameters, e.g. from model.parameters())"
                    )
                if id(param) in seen:
                    raise InputError(f"{name}: a Parameter of shape {param.shape} appears twice in the param groups")
                seen.add(id(param))
            self._check_group(index, group, name)
            self.param_groups.append(group)
        self.state = {}  # Parameter -> {state name: value}; Tensors hash by identity

    @staticmethod
    def _raise_if_bad(where, key, value):
        problem = _hyperparameter_problem(key, value)
        if problem is not None:
            error_class, sentence = problem
            raise error_class(f"{where}: {sentence}")

    def _check_group(self, index, group, where):
        """Raise if a hyperparameter of param group `index` is not allowed (see HYPERPARAMETER_RULES)."""
        for key, value in group.items():
            if key != "params":
                self._raise_if_bad(f"{where}: param group {index}", key, value)

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

    # ----------------------------------------------------------------------------- one step
    def _updates(self):
        """Check everything a step will touch, before anything changes; return the work to do:
        (group, param, data, grad, state) for every Parameter with a gradient, with data and grad
        C-contiguous arrays of the same shape and dtype, and state arrays of that shape and dtype."""
        name = f"{type(self).__name__}.step"
        updates = []
        position = 0  # the Parameter's place in _params(): `param.{position}` in the state dict
        for index, group in enumerate(self.param_groups):
            self._check_group(index, group, name)
            for param in group["params"]:
                where = f"{name}: parameter {position} (param group {index}, shape {param.shape})"
                position += 1
                if param.grad is None:
                    continue
                data, grad = param.data, param.grad
                if not isinstance(data, np.ndarray) or data.dtype not in FLOAT_DTYPES:
                    raise InputTypeError(f"{where}: .data must be a float32 or float64 array, got {type(data).__name__} {getattr(data, 'dtype', '')}")
                if not isinstance(grad, np.ndarray):
                    raise InputTypeError(f"{where}: .grad must be a numpy array like .data, got {type(grad).__name__}")
                if grad.shape != data.shape:
                    raise InputError(f"{where}: .grad has shape {grad.shape}, expected the shape of .data, {data.shape}")
                if grad.dtype != data.dtype:
                    raise InputTypeError(f"{where}: .grad has dtype {grad.dtype}, expected the dtype of .data, {data.dtype}")
                state = self.state.get(param)
                for key, value in (state or {}).items():
                    if isinstance(value, np.ndarray) and (value.shape != data.shape or value.dtype != data.dtype):
                        raise InputError(
                            f"{where}: .data is now {data.shape} {data.dtype}, but the optimizer's state "
                            f"'{key}' was made for {value.shape} {value.dtype} at an earlier step: param.data "
                            "was replaced by an array of another shape or dtype. Build a new optimizer "
                            "after changing a Parameter's shape or dtype (e.g. after model.to(dtype))"
                        )
                updates.append((group, param, _contiguous_data(param), np.ascontiguousarray(grad), self._state(param)))
        return updates

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
        """Restore a `state_dict()` (also after np.savez / np.load).

        Checked before anything changes, with one error (a StateDictError) that lists every problem:
        the keys (missing, unexpected), the number of Parameters in each group, each hyperparameter
        (the same rules as the constructor's: a NaN learning rate or betas of (2, 2) are refused),
        and each Parameter's state (its step an integer >= 0; its arrays of the Parameter's shape and
        dtype, finite, and Adam's v >= 0, since its square root is taken).
        """
        name = type(self).__name__
        if not isinstance(state_dict, Mapping):
            raise InputTypeError(f"{name}.load_state_dict: expected a dict (from state_dict()), got {type(state_dict).__name__}")
        params = self._params()
        problems, used = [], set()
        groups = []
        for g, group in enumerate(self.param_groups):
            count_key = f"group.{g}.num_params"
            used.add(count_key)
            count = as_count(np.asarray(state_dict[count_key])[()]) if count_key in state_dict else None
            if count_key not in state_dict:
                problems.append(f"missing {count_key}")
            elif count != len(group["params"]):
                problems.append(f"group {g} holds {len(group['params'])} params, the state dict {state_dict[count_key]!r}")
            values = {}
            for key, current in group.items():
                full_key = f"group.{g}.{key}"
                if key == "params":
                    continue
                used.add(full_key)
                if full_key not in state_dict:
                    problems.append(f"missing {full_key}")
                    continue
                array = np.asarray(state_dict[full_key])
                if key == "betas":
                    value = tuple(array.tolist()) if array.shape == (2,) else state_dict[full_key]
                elif key == "name":
                    value = str(array[()]) if array.shape == () and array.dtype.kind in "US" else state_dict[full_key]
                else:
                    value = array[()] if array.shape == () else state_dict[full_key]
                problem = _hyperparameter_problem(key, value)
                if problem is not None:
                    problems.append(f"{full_key}: {problem[1]}")
                    continue
                if key == "betas":
                    value = tuple(float(x) for x in value)
                elif key in HYPERPARAMETER_RULES:
                    value = float(value)
                values[key] = value
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
                    if value.shape != () or value.dtype.kind not in "iu" or value < 0:
                        problems.append(f"{full_key} must be an integer >= 0, got {value.dtype} {value!r} of shape {value.shape}")
                    else:
                        state[key] = int(value)
                elif value.shape != param.shape or value.dtype != param.dtype:
                    problems.append(
                        f"{full_key} has shape {value.shape} {value.dtype}, the Parameter {param.shape} {param.dtype}"
                    )
                elif not np.all(np.isfinite(value)) or (key == "v" and not np.all(value >= 0)):
                    problems.append(f"{full_key} holds " + ("a negative value" if np.all(np.isfinite(value)) else "an inf or a nan"))
                else:
                    state[key] = np.array(value, order="C", copy=True)
            states[param] = state
        unexpected = [key for key in state_dict if key not in used]
        if unexpected:
            problems.append(f"unexpected keys: {', '.join(map(str, unexpected))}")
        if problems:
            raise StateDictError(f"{name}.load_state_dict: nothing was loaded, because of\n  " + "\n  ".join(problems))
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


def _changed_in_place(param):
    """Tell the engine that param.data's values changed in place (its version counter), so that a
    backward through a graph that saved the old values is refused instead of using the new ones."""
    param._bump_version()


class SGD(Optimizer):
    """Stochastic gradient descent with momentum and L2 weight decay (see `sgd_update`).
    lr >= 0, momentum in [0, 1), weight_decay >= 0, all finite."""

    state_names = ("momentum_buffer",)

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    def _new_state(self, param):
        return {"momentum_buffer": np.zeros(param.shape, dtype=param.dtype)}

    def step(self):
        for group, param, data, grad, state in self._updates():
            real = data.dtype.type  # np.float32 or np.float64: the scalars' dtype
            active(sgd_update)(
                _flat(data), _flat(grad), _flat(state["momentum_buffer"]),
                real(group["lr"]), real(group["momentum"]), real(group["weight_decay"]),
            )  # fmt: skip
            _changed_in_place(param)


class Adam(Optimizer):
    """Adam (Kingma and Ba, 2014) with bias correction; weight_decay adds weight_decay * param to the
    gradient (an L2 penalty, as PyTorch's Adam does). For decoupled weight decay use AdamW.
    lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0, all finite."""

    state_names = ("step", "m", "v")
    decoupled_weight_decay = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self._raise_if_bad(type(self).__name__, "betas", betas)
        defaults["betas"] = tuple(float(beta) for beta in betas)
        super().__init__(params, defaults)

    def _new_state(self, param):
        return {"step": 0, "m": np.zeros(param.shape, dtype=param.dtype), "v": np.zeros(param.shape, dtype=param.dtype)}

    def step(self):
        for group, param, data, grad, state in self._updates():
            beta1, beta2 = group["betas"]
            if self.decoupled_weight_decay:
                weight_decay, l2 = group["weight_decay"], 0.0
            else:
                weight_decay, l2 = 0.0, group["weight_decay"]
            real = data.dtype.type  # np.float32 or np.float64: the scalars' dtype
            state["step"] += 1
            t = state["step"]
            active(adamw_update)(
                _flat(data), _flat(grad), _flat(state["m"]), _flat(state["v"]),
                real(group["lr"]), real(beta1), real(beta2), real(group["eps"]),
                real(weight_decay), real(l2), real(1 - beta1**t), real(1 - beta2**t),
            )  # fmt: skip
            _changed_in_place(param)


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
    problem = _hyperparameter_problem("weight_decay", weight_decay)
    if problem is not None:
        raise problem[0](f"weight_decay_groups: {problem[1]}")
    if hasattr(params, "parameters"):
        params = params.parameters()
    if isinstance(params, Tensor):
        params = [params]
    params = list(params)
    for param in params:
        if not hasattr(param, "ndim"):  # any array-like parameter will do (a torch one too)
            raise InputTypeError(f"weight_decay_groups: expected a Module or its parameters(), got a {type(param).__name__} among them")
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


# ================================================================================= clipping and schedule


def clip_grad_norm(params, max_norm, error_if_nonfinite=False):
    """Scale all gradients, in place, so that their global L2 norm is at most `max_norm`.

        total_norm = sqrt(sum over every gradient array g of sum(g * g))
        if total_norm > max_norm: every g *= max_norm / (total_norm + 1e-6)

    `params` is an iterable of Parameters (e.g. model.parameters()) or a single Tensor, which counts
    as one parameter (as in PyTorch; iterating it would give its rows). Parameters without a gradient
    are skipped. max_norm must be finite and > 0: a negative one would flip every gradient's sign,
    and 0 would erase them. Returns total_norm before clipping (a Python float), worth logging:
    spikes show instabilities.

    A non-finite total norm (inf or nan) means some gradient holds an inf or a nan, which no scaling
    repairs. By default (error_if_nonfinite=False, PyTorch's default too) the gradients are then left
    as they are and the norm is returned, for the caller to see and skip the step or stop (PyTorch
    would multiply every gradient by nan instead); with error_if_nonfinite=True it is an InputError.
    """
    if isinstance(params, Tensor):
        params = [params]
    elif hasattr(params, "named_parameters"):
        raise InputTypeError(f"clip_grad_norm: expected Parameters, e.g. model.parameters(), got the {type(params).__name__} itself")
    norm = as_real(max_norm)
    if norm is None:
        raise InputTypeError(f"clip_grad_norm: max_norm must be a number, got {type(max_norm).__name__} {max_norm!r}")
    if not (math.isfinite(norm) and norm > 0):
        raise InputError(f"clip_grad_norm: max_norm must be > 0 and finite, got {max_norm}")
    if not isinstance(error_if_nonfinite, (bool, np.bool_)):
        raise InputTypeError(f"clip_grad_norm: error_if_nonfinite must be True or False, got {error_if_nonfinite!r}")
    try:
        params = list(params)
    except TypeError:
        raise InputTypeError(f"clip_grad_norm: expected Parameters, e.g. model.parameters(), got {type(params).__name__}") from None
    grads = []
    for param in params:
        if not isinstance(param, Tensor):
            raise InputTypeError(f"clip_grad_norm: expected Parameters (e.g. model.parameters()), got {type(param).__name__}")
        if param.grad is None:
            continue
        if not isinstance(param.grad, np.ndarray) or param.grad.dtype not in FLOAT_DTYPES:
            raise InputTypeError(
                f"clip_grad_norm: a Parameter of shape {param.shape} has a .grad that is not a float32 or "
                f"float64 array: {type(param.grad).__name__} {getattr(param.grad, 'dtype', '')}"
            )
        grads.append(param.grad)
    total_norm = math.sqrt(sum(_sum_of_squares(g) for g in grads))
    if not math.isfinite(total_norm):
        if error_if_nonfinite:
            raise InputError(
                f"clip_grad_norm: the total norm of the gradients is {total_norm}: a gradient holds an inf "
                "or a nan (error_if_nonfinite=True; with False the gradients are left as they are)"
            )
        return total_norm
    scale = norm / (total_norm + 1e-6)
    if scale < 1.0:
        for g in grads:
            g *= scale  # in place keeps the dtype (float32 stays float32)
    return total_norm


def _sum_of_squares(g):
    """sum(g * g) as a Python float. np.vdot of an array with itself is its sum of squares, in one
    BLAS call and no temporary; in float32 it overflows to inf once the sum passes ~3e38, so an inf
    from finite values is summed again in float64, which holds it."""
    total = float(np.vdot(g, g))
    if math.isinf(total) and g.dtype != np.float64 and np.all(np.isfinite(g)):
        wide = g.astype(np.float64)
        total = float(np.vdot(wide, wide))
    return total


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

    step, warmup_iters and lr_decay_iters are integers >= 0 with warmup_iters <= lr_decay_iters;
    max_lr and min_lr finite numbers >= 0 (min_lr above max_lr is allowed: the "decay" then rises).
    """
    where = "cosine_with_warmup"
    for name, value in (("step", step), ("warmup_iters", warmup_iters), ("lr_decay_iters", lr_decay_iters)):
        count = as_count(value)
        if count is None:
            raise InputTypeError(f"{where}: {name} must be an integer, got {type(value).__name__} {value!r}")
        if count < 0:
            raise InputError(f"{where}: {name} must be >= 0, got {value}")
    for name, value in (("max_lr", max_lr), ("min_lr", min_lr)):
        number = as_real(value)
        if number is None:
            raise InputTypeError(f"{where}: {name} must be a number, got {type(value).__name__} {value!r}")
        if not (math.isfinite(number) and number >= 0):
            raise InputError(f"{where}: {name} must be >= 0 and finite, got {value}")
    if lr_decay_iters < warmup_iters:
        raise InputError(f"{where}: lr_decay_iters ({lr_decay_iters}) must be >= warmup_iters ({warmup_iters})")
    if step < warmup_iters:
        return max_lr * (step + 1) / (warmup_iters + 1)
    if step > lr_decay_iters or lr_decay_iters == warmup_iters:
        return min_lr
    ratio = (step - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)
