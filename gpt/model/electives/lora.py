"""LoRA adapters for a trained model: freeze it, add a low-rank update to some Linear layers, train
only the update, and fold it back in at the end.

    add_lora(model, rank=8, alpha=8, targets=("c_attn", "c_proj"))   # in place: base frozen, adapters added
    ... train: the optimizer gets [p for p in model.parameters() if p.requires_grad] ...
    lora_state_dict(model)       # {"transformer.h.0.attn.c_attn.lora_a": ..., ...}: the adapters alone
    merged = merge_lora(model)   # a plain model: W + (α/r) A B in every adapted Linear, same logits

A `LoRALinear` replaces one `nn.Linear`: it keeps the Linear's weight and bias, frozen
(requires_grad=False), under the same names, and adds `lora_a` (in, r) and `lora_b` (r, out), so
that y = x W + b + (α/r) (x A) B (the op and its backward: microtensor/ops/electives/lora.py). Because the
base weights keep their names, the base checkpoint's state dict loads into the adapted model
unchanged, and the adapters' names (`transformer.h.0.attn.c_attn.lora_a`) say which layer each
belongs to, so a checkpoint can hold the adapters alone and name its base.

Why B = 0 at the start: the update A B is then 0, and the adapted model computes exactly what the
base computes (the logits are bit-identical), so fine-tuning starts from the base model's loss and
moves away from it only as far as training takes it. A starts random, as the paper's (uniform in
±1/√in, as a Linear's weight): were both 0, the gradient of each would be 0 (dA has a factor B and
dB a factor A) and nothing would ever train. With B = 0 the first step changes only B; A follows.

Why α/r: the update is scaled by s = α/r. With α fixed, doubling the rank does not double the size
of the update at the start of training, so a learning rate found for one rank serves another; the
default here is α = r (s = 1).

Targets name Linear layers by the end of their dotted name: "c_attn" adapts every
`...attn.c_attn`, "c_proj" both attention's and the MLP's output projections, "attn.c_proj" only
attention's. The GPT's Linear layers are c_attn, c_proj, c_fc (and c_up with SwiGLU, router and
the experts' layers with a mixture of experts, lm_head when the output layer is not tied to the
token embedding).
"""
import copy
import math
from contextlib import contextmanager

import numpy as np

import microtensor as mt
from microtensor import InputError, InputTypeError, StateDictError, nn
from microtensor.checks import check_layer_input
from microtensor.functional import lora_linear

DEFAULT_TARGETS = ("c_attn", "c_proj")
ADAPTER_NAMES = ("lora_a", "lora_b")  # the parameter names a LoRALinear adds


@contextmanager
def generator_left_alone():
    """Run the block without changing the global random generator's state (building a layer draws
    initial weights that are then overwritten: that draw must not shift what comes after)."""
    state = mt.random.get_state()
    try:
        yield
    finally:
        mt.random.set_state(state)


class LoRALinear(nn.Module):
    """A Linear layer's frozen weight (in, out) and bias (out,) or None, plus a trainable low-rank
    update: y = x W + b + (alpha / rank) (x lora_a) lora_b, lora_a (in, rank) and lora_b (rank, out).

    lora_a starts uniform in [-1/√in, 1/√in], lora_b at 0 (see the module docstring). The Linear's
    weight and bias are taken over, the same Parameter objects, with requires_grad set to False.
    """

    fits_decode_kernel = False  # the one-token kernel (gpt/generation/decode_kernel.py) would leave out the low-rank term

    def __init__(self, linear, rank, alpha, name="the layer"):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise InputTypeError(f"LoRALinear: expected an nn.Linear to adapt, got {type(linear).__name__}")
        rank = _check_rank(rank)
        alpha = _check_alpha(alpha)
        n_in, n_out = linear.weight.shape
        _check_rank_fits(rank, name, n_in, n_out)
        self.in_features, self.out_features, self.rank, self.alpha = n_in, n_out, rank, alpha
        self.scale = alpha / rank
        dtype = linear.weight.dtype
        self.weight = linear.weight.requires_grad_(False)
        self.bias = None if linear.bias is None else linear.bias.requires_grad_(False)
        bound = 1.0 / math.sqrt(n_in)
        self.lora_a = nn.Parameter(mt.get_generator().uniform(-bound, bound, (n_in, rank)).astype(dtype))
        self.lora_b = nn.Parameter(np.zeros((rank, n_out), dtype=dtype))

    def forward(self, x):
        check_layer_input(self, x, self.in_features, self.weight.dtype)
        return lora_linear(x, self.weight, self.bias, self.lora_a, self.lora_b, self.scale)

    def merged_weight(self):
        """W + (alpha / rank) A B (in, out) in the weight's dtype, summed in float64 and rounded once."""
        update = self.lora_a.data.astype(np.float64) @ self.lora_b.data.astype(np.float64)  # (in, out), rank <= r
        return (self.weight.data.astype(np.float64) + self.scale * update).astype(self.weight.dtype)

    def extra_repr(self):
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"rank={self.rank}, alpha={self.alpha:g}"
        )


def _check_rank(rank):
    if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)):
        raise InputTypeError(f"LoRA: rank must be an int, got {type(rank).__name__} {rank!r}")
    if rank < 1:
        raise InputError(f"LoRA: rank must be >= 1, got {rank}")
    return int(rank)


def _check_alpha(alpha):
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise InputTypeError(f"LoRA: alpha must be a number, got {type(alpha).__name__} {alpha!r}")
    if not (math.isfinite(alpha) and alpha > 0):
        raise InputError(f"LoRA: alpha must be > 0 and finite, got {alpha}")
    return float(alpha)


def _check_rank_fits(rank, name, n_in, n_out):
    if rank > min(n_in, n_out):
        raise InputError(
            f"LoRA: rank {rank} is larger than the width of {name}, min(in, out) = min({n_in}, {n_out}) = "
            f"{min(n_in, n_out)}; an update A B of a ({n_in}, {n_out}) matrix has rank at most {min(n_in, n_out)}"
        )


def check_targets(targets):
    """targets as a tuple of names: a comma-separated string or a list of strings, none empty, none twice."""
    if isinstance(targets, str):
        targets = targets.split(",")
    if not isinstance(targets, (list, tuple)) or not all(isinstance(t, str) for t in targets):
        raise InputTypeError(f"LoRA: targets must be names of Linear layers (strings), got {targets!r}")
    targets = tuple(t.strip() for t in targets)
    if not targets or "" in targets:
        raise InputError(f"LoRA: targets must be non-empty names of Linear layers, e.g. c_attn,c_proj; got {targets!r}")
    repeated = sorted({t for t in targets if targets.count(t) > 1})
    if repeated:
        raise InputError(f"LoRA: targets name {', '.join(repeated)} more than once")
    return targets


def _matches(name, target):
    """A Linear's dotted name matches a target equal to it or to its last parts ("attn.c_proj")."""
    return name == target or name.endswith("." + target)


def lora_layers(model):
    """(dotted name, LoRALinear) for every adapted layer of model, in the model's order."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, LoRALinear)]


def has_lora(model):
    """Whether model holds any LoRA adapter (a LoRALinear)."""
    return bool(lora_layers(model))


def target_layers(model, targets):
    """[(dotted name, nn.Linear)] of model's Linear layers that the targets name, in the model's
    order; an InputError names a target that matches none, and lists the names there are."""
    targets = check_targets(targets)
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    chosen = set()
    for target in targets:
        found = {name for name, _ in linears if _matches(name, target)}
        if not found:
            known = sorted({name.rsplit(".", 1)[-1] for name, _ in linears})
            raise InputError(
                f"LoRA: no Linear layer of the {type(model).__name__} is named {target!r}; "
                f"its Linear layers are named {', '.join(known) or '(none)'}"
                + (" (lm_head exists only when the output layer is not tied to the embedding: --no-tie-weights)" if target == "lm_head" else "")
            )
        chosen |= found
    return [(name, module) for name, module in linears if name in chosen]


def add_lora(model, rank, alpha=None, targets=DEFAULT_TARGETS):
    """Adapt `model` in place and return it: every parameter frozen (requires_grad=False), and every
    Linear whose name matches a target replaced by a LoRALinear of that rank, whose lora_a and lora_b
    are then the only parameters that require a gradient.

    rank: an int >= 1, at most min(in, out) of every targeted layer. alpha: a finite number > 0;
    None means alpha = rank (scale 1). targets: names of Linear layers (see the module docstring),
    a list or a comma-separated string; each must match at least one Linear of the model.
    Nothing is changed when an argument is refused."""
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"add_lora: expected a Module (a model), got {type(model).__name__}")
    rank = _check_rank(rank)
    alpha = float(rank) if alpha is None else _check_alpha(alpha)
    if has_lora(model):
        raise InputError(
            f"add_lora: the model already holds LoRA adapters ({lora_layers(model)[0][0]}, ...); "
            "merge them first (merge_lora) to add others"
        )
    chosen = target_layers(model, targets)
    for name, linear in chosen:  # every width checked before anything changes
        _check_rank_fits(rank, name, *linear.weight.shape)
    for param in model.parameters():
        param.requires_grad_(False)
        param.grad = None
    for name, linear in chosen:
        parent_name, _, attribute = name.rpartition(".")
        setattr(_submodule(model, parent_name), attribute, LoRALinear(linear, rank, alpha, name))
    return model


def _submodule(model, dotted):
    module = model
    for part in dotted.split(".") if dotted else ():
        module = module._modules[part]
    return module


def lora_parameters(model):
    """The adapters' Parameters (every lora_a and lora_b), in the model's order: what an optimizer trains."""
    return [param for name, param in model.named_parameters() if name.rsplit(".", 1)[-1] in ADAPTER_NAMES]


def lora_state_dict(model):
    """{dotted name: a copy of the values} of the adapters alone: what an adapter checkpoint holds."""
    return {name: param.data.copy() for name, param in model.named_parameters() if name.rsplit(".", 1)[-1] in ADAPTER_NAMES}


def load_lora_state_dict(model, state_dict):
    """Copy the adapters of `state_dict` (from lora_state_dict) into model's, in place. Every adapter
    must be there with its shape and dtype, and nothing else: one StateDictError lists every problem,
    and nothing is copied then."""
    expected = {name: param for name, param in model.named_parameters() if name.rsplit(".", 1)[-1] in ADAPTER_NAMES}
    if not expected:
        raise InputError("load_lora_state_dict: the model holds no LoRA adapters; add_lora first")
    unexpected = [name for name in state_dict if name not in expected]
    if unexpected:
        raise StateDictError(
            f"load_lora_state_dict: nothing was loaded: unexpected keys (not adapters of this model): {', '.join(unexpected)}"
        )
    # The base weights are in the model and not in the state dict: strict=False ignores them, and
    # every adapter must be present, which the check below makes sure of.
    missing = [name for name in expected if name not in state_dict]
    if missing:
        raise StateDictError(f"load_lora_state_dict: nothing was loaded: missing adapters: {', '.join(missing)}")
    model.load_state_dict(state_dict, strict=False)


def merge_lora(model):
    """A plain copy of `model` with every LoRALinear folded into an nn.Linear of weight
    W + (alpha / rank) A B (summed in float64, rounded once to the model's dtype); `model` itself is
    not changed. Every parameter of the copy requires a gradient, as in a freshly loaded model.

    The copy computes the same function as the adapted model: x W' = x W + s x A B exactly in real
    numbers; in floating point the sums run in another order, so the logits agree up to rounding."""
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"merge_lora: expected a Module (a model), got {type(model).__name__}")
    merged = copy.deepcopy(model)
    for name, layer in lora_layers(merged):
        with generator_left_alone():  # the new Linear's random initial weights are replaced at once
            linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, dtype=layer.weight.dtype)
        linear.weight.data[...] = layer.merged_weight()
        if layer.bias is not None:
            linear.bias.data[...] = layer.bias.data
        parent_name, _, attribute = name.rpartition(".")
        setattr(_submodule(merged, parent_name), attribute, linear)
    for param in merged.parameters():
        param.requires_grad_(True)
    return merged


def count_parameters(model):
    """(trainable, total): the numbers that require a gradient, and all of them."""
    params = list(model.parameters())
    return sum(p.data.size for p in params if p.requires_grad), sum(p.data.size for p in params)
