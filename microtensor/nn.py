"""Modules: the weights of a model, and the code that uses them, kept together.

    import microtensor.nn as nn
    import microtensor.functional as F

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(2, 16)    # assigning a Module or a Parameter registers it
            self.fc2 = nn.Linear(16, 1)

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x)))

    model = MLP()
    [name for name, p in model.named_parameters()]  # ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias']

A `Parameter` is a Tensor that requires a gradient and that a Module owns. A `Module` remembers
every Parameter and every sub-Module assigned to it as an attribute, in the order of assignment, so
that `parameters()` can hand them all to an optimizer, `state_dict()` can save them under dotted names
(`transformer.h.0.attn.c_attn.weight`), and `train()`/`eval()` can reach every module of the tree.
The layers (`Linear`, `Embedding`, `LayerNorm`, `RMSNorm`, `Dropout`) hold no math of their own:
their `forward` calls one function of `microtensor.functional`, where the math and the backward live.

Initial weights come from microtensor's global generator (`microtensor.manual_seed(seed)` makes a
model repeatable). They are drawn in float64 and then rounded to the module's dtype, so a float32 and
a float64 model built after the same seed hold the same weights (up to rounding): handy for checking
a float32 model's gradients against a float64 one.
"""
import difflib
import math
from collections import namedtuple
from collections.abc import Mapping

import numpy as np

from . import functional as F
from .checks import allocate, check_layer_dtype, check_layer_flag, check_layer_input, check_norm_eps, check_size, float32
from .errors import InputError, InputIndexError, InputTypeError, StateDictError
# What quantized layers are built of (weights kept as integers and scales, for inference: no
# backward, so these are not in functional), and RoPE's table of angles, beside the sinusoidal one below.
from .ops.electives.quantize import BITS, DEFAULT_GROUP_SIZE, QuantizedMatrix, quantize, quantized_matmul, quantized_rows  # noqa: F401
from .ops.electives.rope import rope_angles  # noqa: F401
from .random import get_generator
from .tensor import Tensor


class Parameter(Tensor):
    """A Tensor that a Module registers as one of its weights; requires_grad=True by default.

    The values are copied, so the Parameter owns its array. Ops on a Parameter return plain Tensors.
    """

    __slots__ = ()

    def __init__(self, data, requires_grad=True):
        if isinstance(data, Tensor):
            data = data.data
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


# What load_state_dict(strict=False) returns: the names it could not fill, and the names it ignored.
LoadResult = namedtuple("LoadResult", ["missing_keys", "unexpected_keys"])


class Module:
    """Base class of every layer and model: subclass it, assign Parameters and Modules in
    `__init__` (after `super().__init__()`), and write `forward`. `module(x)` calls `forward(x)`.

    The registered Parameters and Modules are ordinary attributes (`self.weight` is a plain lookup);
    `_parameters` and `_modules` remember their names in assignment order.
    """

    def __init__(self):
        # object.__setattr__: these three must exist before our own __setattr__ can work.
        object.__setattr__(self, "_parameters", {})  # name -> Parameter (or None), in assignment order
        object.__setattr__(self, "_modules", {})  # name -> Module (or None), in assignment order
        object.__setattr__(self, "training", True)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward(); define forward() in the subclass")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ----------------------------------------------------------------------------- registration
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign '{name}' to {type(self).__name__} before Module.__init__() has run; "
                "call super().__init__() first in your __init__"
            )
        params, modules = self._parameters, self._modules
        if isinstance(value, (Parameter, Module)):
            if hasattr(type(self), name):
                raise AttributeError(
                    f"{type(self).__name__}: the name '{name}' is taken by {type(self).__name__}.{name} "
                    f"(a method or class attribute); choose another name for this "
                    f"{type(value).__name__}"
                )
            if isinstance(value, Parameter):
                modules.pop(name, None)
                params[name] = value  # a name assigned again keeps its place in the order
            else:
                params.pop(name, None)
                modules[name] = value
        elif name in params or name in modules:
            if value is not None:
                kind = "Parameter" if name in params else "Module"
                raise InputTypeError(
                    f"{type(self).__name__}.{name} is a registered {kind}; assign a {kind} or None to it, "
                    f"not a {type(value).__name__}"
                )
            (params if name in params else modules)[name] = None  # e.g. bias=False: skipped everywhere
        elif isinstance(value, Tensor) and value.requires_grad and value.is_leaf:
            raise InputTypeError(
                f"{type(self).__name__}.{name}: a Tensor that requires a gradient would not be registered, "
                f"so no optimizer would update it; wrap it in nn.Parameter(...) (or .detach() it)"
            )
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    def __getattr__(self, name):
        # Only called when the ordinary lookup failed: the attribute does not exist.
        if name.startswith("__") or "_parameters" not in self.__dict__:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        known = list(self._parameters) + list(self._modules)
        hint = ""
        close = difflib.get_close_matches(name, known + [n for n in self.__dict__ if not n.startswith("_")], n=1)
        if close:
            hint = f"; did you mean '{close[0]}'?"
        elif known:
            hint = f"; its parameters and submodules are: {', '.join(known)}"
        raise AttributeError(f"{type(self).__name__} has no attribute '{name}'{hint}")

    # ----------------------------------------------------------------------------- the tree
    def named_children(self):
        for name, module in self._modules.items():
            if module is not None:
                yield name, module

    def children(self):
        for _, module in self.named_children():
            yield module

    def named_modules(self, prefix=""):
        """(dotted name, module) for this module ("") and every module below it, parents first.
        A module reachable along two paths is listed once, under the first name found."""
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            # Reversed onto the stack, so children come out in assignment order.
            for child_name, child in reversed(list(module.named_children())):
                stack.append((f"{name}.{child_name}" if name else child_name, child))

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def named_parameters(self):
        """(dotted name, Parameter) for every Parameter of the tree, in registration order.

        A Parameter shared by two modules (tied weights, e.g. nanoGPT's `lm_head.weight` is
        `transformer.wte.weight`) is listed once, under the first name found, so an optimizer
        updates it once and `state_dict` saves it once.
        """
        seen = set()
        for module_name, module in self.named_modules():
            for name, param in module._parameters.items():
                if param is None or id(param) in seen:
                    continue
                seen.add(id(param))
                yield (f"{module_name}.{name}" if module_name else name), param

    def parameters(self):
        for _, param in self.named_parameters():
            yield param

    def num_parameters(self):
        """How many numbers the model learns (shared Parameters counted once)."""
        return sum(p.data.size for p in self.parameters())

    # ----------------------------------------------------------------------------- modes, grads, dtype
    def train(self, mode=True):
        """Set `.training` on this module and every module below it (Dropout reads it). Returns self."""
        mode = check_layer_flag(f"{type(self).__name__}.train", "mode", mode)
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self):
        """`train(False)`: dropout off. Returns self."""
        return self.train(False)

    def zero_grad(self):
        """Forget the gradients (`.grad = None`), so the next backward starts from nothing."""
        for param in self.parameters():
            param.grad = None

    def to(self, dtype):
        """Cast every Parameter to float32 or float64 in place (the Parameter objects stay the same,
        so tied weights stay tied). Build the optimizer afterwards: its state has the old dtype."""
        dtype = check_layer_dtype(f"{type(self).__name__}.to", dtype)
        for param in self.parameters():
            param.data = param.data.astype(dtype)
            param.grad = None
        return self

    # ----------------------------------------------------------------------------- saving and loading
    def state_dict(self):
        """{dotted name: a copy of the Parameter's values as a numpy array}, ready for np.savez."""
        return {name: param.data.copy() for name, param in self.named_parameters()}

    def load_state_dict(self, state_dict, strict=True):
        """Copy the arrays of `state_dict` into the Parameters with the same names, in place.

        Every name, shape and dtype is checked before anything is copied, and one error (a
        StateDictError) lists every problem: missing and unexpected names (only when `strict`), and
        mismatched shapes or dtypes (always). Returns `LoadResult(missing_keys, unexpected_keys)`.
        """
        where = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, Mapping):
            raise InputTypeError(f"{where}: expected a dict of arrays (from state_dict()), got {type(state_dict).__name__}")
        strict = check_layer_flag(where, "strict", strict)
        params = dict(self.named_parameters())
        missing = [name for name in params if name not in state_dict]
        unexpected = [name for name in state_dict if name not in params]
        mismatched = []
        arrays = {}
        for name, param in params.items():
            if name not in state_dict:
                continue
            value = state_dict[name]
            array = value.data if isinstance(value, Tensor) else np.asarray(value)
            if array.shape != param.shape or array.dtype != param.dtype:
                mismatched.append(
                    f"{name}: the checkpoint has shape {array.shape} {array.dtype}, "
                    f"the model has {param.shape} {param.dtype}"
                )
            arrays[name] = array
        problems = []
        if strict and missing:
            problems.append(f"missing keys (in the model, not in the state dict): {', '.join(missing)}")
        if strict and unexpected:
            problems.append(f"unexpected keys (in the state dict, not in the model): {', '.join(unexpected)}")
        if mismatched:
            problems.append("mismatched shapes or dtypes:\n    " + "\n    ".join(mismatched))
        if problems:
            raise StateDictError(f"{where}: nothing was loaded, because of\n  " + "\n  ".join(problems))
        for name, array in arrays.items():
            np.copyto(params[name].data, array)
            params[name]._bump_version()  # values an op saved for a pending backward have changed
        return LoadResult(missing, unexpected)

    # ----------------------------------------------------------------------------- printing
    def extra_repr(self):
        """The arguments shown between the parentheses of this module's repr (override it)."""
        return ""

    def __repr__(self):
        children = [f"({name}): " + repr(module).replace("\n", "\n  ") for name, module in self.named_children()]
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = ([self.extra_repr()] if self.extra_repr() else []) + children
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


class ModuleList(Module):
    """A list of Modules, registered under the names "0", "1", ... (`h.0.attn.c_attn.weight`)."""

    def __init__(self, modules=()):
        super().__init__()
        for module in modules:
            self.append(module)

    def append(self, module):
        if not isinstance(module, Module):
            raise InputTypeError(f"ModuleList: expected a Module, got {type(module).__name__}")
        setattr(self, str(len(self)), module)
        return self

    def extend(self, modules):
        for module in modules:
            self.append(module)
        return self

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ModuleList(list(self._modules.values())[index])
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise InputTypeError(f"ModuleList: an index must be an int or a slice, got {type(index).__name__}")
        if not -len(self) <= index < len(self):
            raise InputIndexError(f"ModuleList: index {index} is out of range for a list of {len(self)} modules")
        return self._modules[str(index % len(self))]

    def __setitem__(self, index, module):
        self[index]  # the same range check as reading
        if not isinstance(module, Module):
            raise InputTypeError(f"ModuleList: expected a Module, got {type(module).__name__}")
        setattr(self, str(index % len(self)), module)


class ModuleDict(Module):
    """A dict of Modules, registered under their keys; `d["wte"]` and `d.wte` are the same module."""

    def __init__(self, modules=None):
        super().__init__()
        for name, module in (modules or {}).items():
            self[name] = module

    def __setitem__(self, name, module):
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"ModuleDict: keys must be non-empty strings without '.', got {name!r}")
        if not isinstance(module, Module):
            raise InputTypeError(f"ModuleDict: expected a Module for key {name!r}, got {type(module).__name__}")
        setattr(self, name, module)

    def __getitem__(self, name):
        if name not in self._modules:
            raise KeyError(f"ModuleDict has no key {name!r}; its keys are: {', '.join(self._modules)}")
        return self._modules[name]

    def __contains__(self, name):
        return name in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()


# ================================================================================= layers
class Linear(Module):
    """y = x @ weight + bias, with weight of shape (in_features, out_features).

    Row vectors: each input is a row and y = x W reads left to right, with no transpose to keep in mind.
    PyTorch and llm.c store the transpose, (out_features, in_features), and compute x Wᵀ.
    x (..., in_features) -> y (..., out_features). Initial values uniform in [-k, k], k = 1/sqrt(in_features).
    """

    def __init__(self, in_features, out_features, bias=True, dtype=float32):
        super().__init__()
        dtype = check_layer_dtype("Linear", dtype)
        in_features = check_size("Linear", "in_features", in_features)
        out_features = check_size("Linear", "out_features", out_features)
        bias = check_layer_flag("Linear", "bias", bias)
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / np.sqrt(in_features)
        generator = get_generator()
        def uniform(shape, dtype):
            return generator.uniform(-bound, bound, shape).astype(dtype)

        self.weight = Parameter(allocate("Linear", uniform, (in_features, out_features), dtype))
        if bias:
            self.bias = Parameter(allocate("Linear", uniform, (out_features,), dtype))
        else:
            self.bias = None

    def forward(self, x):
        check_layer_input(self, x, self.weight.shape[0], self.weight.dtype)
        y = F.matmul(x, self.weight)  # (..., in) @ (in, out) -> (..., out)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A lookup table: row `ids[...]` of weight (num_embeddings, embedding_dim). Initial values N(0, 1)."""

    def __init__(self, num_embeddings, embedding_dim, dtype=float32):
        super().__init__()
        dtype = check_layer_dtype("Embedding", dtype)
        num_embeddings = check_size("Embedding", "num_embeddings", num_embeddings)
        embedding_dim = check_size("Embedding", "embedding_dim", embedding_dim)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        def normal(shape, dtype):
            return get_generator().standard_normal(shape).astype(dtype)

        self.weight = Parameter(allocate("Embedding", normal, (num_embeddings, embedding_dim), dtype))

    def forward(self, ids):
        if not isinstance(ids, Tensor):
            raise InputTypeError(f"{self!r}: expected a Tensor of ids, got {type(ids).__name__}; wrap it with mt.tensor(...)")
        if ids.dtype.kind not in "iu":
            raise InputTypeError(f"{self!r}: ids must be integers, got {ids.dtype} of shape {ids.shape}")
        rows = self.weight.shape[0]
        if ids.data.size and (ids.data.min() < 0 or ids.data.max() >= rows):
            bad = ids.data[(ids.data < 0) | (ids.data >= rows)].flat[0]
            raise InputError(f"{self!r}: id {bad} is out of range; ids must be in [0, {rows})")
        return F.embedding(ids, self.weight)  # (...) int -> (..., embedding_dim)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """Normalize the last dim to mean 0 and variance 1, then scale by weight and shift by bias.
    weight starts at ones, bias at zeros; `bias=False` drops the bias (as nanoGPT's option does)."""

    def __init__(self, dim, eps=1e-5, bias=True, dtype=float32):
        super().__init__()
        dtype = check_layer_dtype("LayerNorm", dtype)
        dim, eps = check_size("LayerNorm", "dim", dim), check_norm_eps("LayerNorm", eps)
        bias = check_layer_flag("LayerNorm", "bias", bias)
        self.dim, self.eps = dim, eps
        self.weight = Parameter(np.ones(dim, dtype=dtype))
        self.bias = Parameter(np.zeros(dim, dtype=dtype)) if bias else None

    def forward(self, x):
        check_layer_input(self, x, self.weight.shape[0], self.weight.dtype)
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.dim}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(Module):
    """Divide the last dim by its root mean square, then scale by weight (starts at ones)."""

    def __init__(self, dim, eps=1e-5, dtype=float32):
        super().__init__()
        dtype = check_layer_dtype("RMSNorm", dtype)
        dim, eps = check_size("RMSNorm", "dim", dim), check_norm_eps("RMSNorm", eps)
        self.dim, self.eps = dim, eps
        self.weight = Parameter(np.ones(dim, dtype=dtype))

    def forward(self, x):
        check_layer_input(self, x, self.weight.shape[0], self.weight.dtype)
        return F.rms_norm(x, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.dim}, eps={self.eps}"


class Dropout(Module):
    """In training mode, zero each element with probability p and scale the rest by 1/(1-p);
    in eval mode (after `model.eval()`), pass the input through unchanged."""

    def __init__(self, p=0.5):
        super().__init__()
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer, np.floating)):
            raise InputTypeError(f"Dropout: p must be a number, got {type(p).__name__} {p!r}")
        if not 0 <= p < 1:
            raise InputError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = float(p)

    def forward(self, x):
        if not isinstance(x, Tensor):
            raise InputTypeError(f"{self!r}: expected a Tensor input, got {type(x).__name__}; wrap it with mt.tensor(...)")
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


# ================================================================================= position tables
# The sinusoidal table of "Attention Is All You Need": a constant the GPT adds to its token
# embeddings with pos="sinusoidal" (docs/electives/positions.md). It lives beside the layers rather than in
# ops/ because it is not an op: nothing here has a backward, it is a table of numbers a model uses.


def sinusoidal_positions(start, length, width, dtype):
    """The fixed table of "Attention Is All You Need", rows start .. start + length - 1 (length, width):
    PE[p, 2i] = sin(p / 10000^(2i / width)), PE[p, 2i + 1] = cos(p / 10000^(2i / width)). Each pair of
    columns turns at its own frequency, from one turn per 2π positions to one per 10000·2π, so every
    position gets a distinct row, and a shift by k positions is the same rotation of each pair for
    every p: the model can learn relative offsets from it. Computed for any position: nothing is
    learned, so nothing limits it to the positions seen in training."""
    position = np.arange(start, start + length, dtype=np.float64)[:, None]  # (T, 1)
    frequency = 10000.0 ** (-np.arange(0, width, 2, dtype=np.float64) / width)  # (width / 2,)
    table = np.empty((length, width), dtype=np.float64)
    table[:, 0::2] = np.sin(position * frequency)
    table[:, 1::2] = np.cos(position * frequency)
    return table.astype(dtype)


def sinusoidal_embedding(start, length, width, dtype):
    """What the GPT adds to its token embeddings: the table divided by √width. The paper multiplies
    the token embeddings by √width instead; both give tokens and positions the same ratio, but this
    way keeps the residual stream at the size GPT-2's initialization (N(0, 0.02)) gives it. Added at
    full size, positions of amplitude 1 would drown tokens 50 times smaller."""
    return (sinusoidal_positions(start, length, width, np.float64) / np.sqrt(width)).astype(dtype)
