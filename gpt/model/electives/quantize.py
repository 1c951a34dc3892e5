"""A trained model's weights as int8 (or int4) codes and float scales, for inference.

    model = GPT(config)
    model.load_state_dict(state)
    quantize_model(model, bits=8)                 # in place, and returned; or bits=4, group_size=32
    with mt.no_grad():
        logits, loss = model(idx, targets)        # the same call as before
    model.generate(idx, 200)                      # generation, with the KV cache, through the modules

`quantize_model` swaps modules and changes nothing else: every `nn.Linear` becomes a
`QuantizedLinear` (the same call, y = x @ Ŵ + b, its weight kept as codes and scales, its bias float)
and every `nn.Embedding` a `QuantizedEmbedding` (its table stored row by row, one scale per row, or
per group of a row for int4, since a looked-up row needs only its own scales). The math, the error
bound and the kernels are in microtensor/ops/electives/quantize.py. What stays in float: the norms' weights
and the biases (a few numbers per layer, which add a float vector to the output anyway).

The tied head. A GPT with tied weights computes its logits as x @ wteᵀ, the token embedding used
transposed. The quantized table is stored as the embedding's rows (V, C), which are the head's
output channels, so `QuantizedEmbedding.tied_head(x)` computes x @ Ŵteᵀ from the same codes and
per-row scales, with kernels that read the table row by row: no float table is ever made. GPT.forward
calls it in place of `x @ wte.weight.T` when wte is quantized. An untied head (`lm_head`) is a
Linear like the others.

Inference only. The quantized weights are not Parameters: an optimizer finds only the float ones,
and `quantize_model` sets requires_grad False on those, so no forward records a graph and a
backward is refused (there is nothing to differentiate). The products refuse an input that requires
a gradient while gradients are on (ops/electives/quantize.py says why). Quantize a copy (load the checkpoint
again) to keep training the float model.

Generation. Under the fast kernel set, the decode kernel (gpt/generation/decode_kernel.py) reads the
codes and scales as they are stored here and dequantizes them inside its products, so a quantized
model's tokens take the same one-call step as a float model's, reading 1 byte (int8) or half a byte
(int4) per weight instead of 4. Under the readable set every token goes through these modules, with
the same KV cache.
"""
import numpy as np

import microtensor as mt
from microtensor import FLOAT_DTYPES, InputError, InputTypeError, nn
from microtensor.checks import check_int
from microtensor.nn import BITS, DEFAULT_GROUP_SIZE, QuantizedMatrix, quantize, quantized_matmul, quantized_rows
from gpt.model.electives.lora import lora_layers


class QuantizedLinear(nn.Module):
    """nn.Linear's call, y = x @ Ŵ + b, with Ŵ (in_features, out_features) held as a QuantizedMatrix
    (`weight`: codes and scales, not a Parameter) and the bias kept as the float Parameter it was."""

    def __init__(self, linear, bits=8, group_size=None):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise InputTypeError(f"QuantizedLinear: expected an nn.Linear to quantize, got {type(linear).__name__}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = quantize(linear.weight.data, bits, group_size)  # (in, out), layout "in_out"
        self.bias = linear.bias  # a float Parameter (out,), or None

    def forward(self, x):
        _check_input(self, x, self.in_features, self.weight.dtype)
        y = quantized_matmul(x, self.weight)  # (..., in) @ Ŵ (in, out) -> (..., out)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        w = self.weight
        group = "" if w.group_size is None else f", group_size={w.group_size}"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, bits={w.bits}{group}"


class QuantizedEmbedding(nn.Module):
    """nn.Embedding's lookup from a quantized table (V, C): `weight` is a QuantizedMatrix of layout
    "out_in" that stores the table's rows, one scale per row (int8) or per group of a row (int4).
    It stands for W = tableᵀ (C, V), so the same codes serve the lookup (rows of the table) and the
    tied head (`tied_head`: x @ tableᵀ)."""

    def __init__(self, embedding, bits=8, group_size=None):
        super().__init__()
        if not isinstance(embedding, nn.Embedding):
            raise InputTypeError(f"QuantizedEmbedding: expected an nn.Embedding to quantize, got {type(embedding).__name__}")
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.weight = quantize(embedding.weight.data, bits, group_size, layout="out_in")  # rows (V, C)

    def forward(self, ids):
        """ids (...) ints in [0, V) -> their dequantized rows (..., C)."""
        if not isinstance(ids, mt.Tensor):
            raise InputTypeError(f"{self!r}: expected a Tensor of ids, got {type(ids).__name__}; wrap it with mt.tensor(...)")
        if ids.dtype.kind not in "iu":
            raise InputTypeError(f"{self!r}: ids must be integers, got {ids.dtype} of shape {ids.shape}")
        return quantized_rows(ids, self.weight)

    def tied_head(self, x):
        """The tied output head: x (..., C) @ Ŵᵀ (C, V) -> logits (..., V), from the table's codes."""
        _check_input(self, x, self.embedding_dim, self.weight.dtype)
        return quantized_matmul(x, self.weight)

    def extra_repr(self):
        w = self.weight
        group = "" if w.group_size is None else f", group_size={w.group_size}"
        return f"{self.num_embeddings}, {self.embedding_dim}, bits={w.bits}{group}"


def _check_input(module, x, last_dim, dtype):
    """A quantized layer's input: a Tensor of the layer's float dtype whose last dim is `last_dim`."""
    if not isinstance(x, mt.Tensor):
        raise InputTypeError(f"{module!r}: expected a Tensor input, got {type(x).__name__}; wrap it with mt.tensor(...)")
    if x.ndim == 0 or x.shape[-1] != last_dim:
        raise InputError(f"{module!r}: expected an input whose last dim is {last_dim}, got shape {x.shape}")
    if x.dtype != dtype:
        raise InputTypeError(f"{module!r}: expected a {dtype} input (the scales' dtype), got {x.dtype}")


def quantize_model(model, bits=8, group_size=None):
    """Replace, in place, every nn.Linear of `model` by a QuantizedLinear and every nn.Embedding by a
    QuantizedEmbedding; return the model, in eval mode, inference only (see the module docstring).

    bits: 8 (int8, one scale per output channel) or 4 (int4, one scale per group of group_size
    input rows of each output channel, DEFAULT_GROUP_SIZE when None; two codes per byte).
    group_size applies to bits=4 only. A module shared by several parents is quantized once.
    `model.quantization` then holds {"bits": ..., "group_size": ...}."""
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"quantize_model: expected an nn.Module, got {type(model).__name__}")
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)) or bits not in BITS:
        raise InputError(f"quantize_model: bits must be 4 or 8, got {bits!r}")
    bits = int(bits)
    if bits == 8 and group_size is not None:
        raise InputError(f"quantize_model: group_size applies to bits=4 only (int8 has one scale per output channel), got {group_size!r}")
    if bits == 4:
        group_size = DEFAULT_GROUP_SIZE if group_size is None else check_int("quantize_model", "group_size", group_size, low=1)
    if is_quantized(model) or any(isinstance(m, (QuantizedLinear, QuantizedEmbedding)) for m in model.modules()):
        raise InputError("quantize_model: the model is quantized already; load the float weights again to quantize them otherwise")
    adapted = [name for name, _ in lora_layers(model)]
    if adapted:
        raise InputError(
            f"quantize_model: {', '.join(adapted[:3])}{' ...' if len(adapted) > 3 else ''} hold unmerged LoRA adapters, "
            "which a quantized layer cannot keep; merge them into the weights first (gpt.model.electives.lora.merge_lora)"
        )
    targets = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))]
    if not targets:
        raise InputError(f"quantize_model: {type(model).__name__} holds no nn.Linear or nn.Embedding to quantize")
    if model is targets[0]:
        raise InputError(f"quantize_model: the model itself is an {type(model).__name__}; quantize a model that holds it")
    replacements = {}  # id(float module) -> its quantized module, so a shared module stays shared
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, (nn.Linear, nn.Embedding)):
                if id(child) not in replacements:
                    kind = QuantizedLinear if isinstance(child, nn.Linear) else QuantizedEmbedding
                    replacements[id(child)] = kind(child, bits, group_size)
                setattr(parent, name, replacements[id(child)])
    for parameter in model.parameters():  # the norms and biases left in float
        parameter.requires_grad_(False)
        parameter.grad = None
    model.eval()
    model.quantization = {"bits": bits, "group_size": group_size}
    return model


def is_quantized(model):
    """Whether quantize_model has quantized `model` (its weights are then codes, not Parameters)."""
    return getattr(model, "quantization", None) is not None


def weight_bytes(model):
    """The bytes a model's weights take, as a dict:

        codes     the integer codes of the quantized matrices (int8: 1 byte each; int4: 1/2)
        scales    their float scales
        float     every Parameter left in float (norms, biases; everything, for a float model)
        total     codes + scales + float
        float32   the same weights all as float32 numbers (4 bytes each), to compare against

    A Parameter or a quantized matrix shared by several modules is counted once."""
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"weight_bytes: expected an nn.Module, got {type(model).__name__}")
    codes = scales = numbers = 0
    seen = set()
    for module in model.modules():
        w = getattr(module, "weight", None) if isinstance(module, (QuantizedLinear, QuantizedEmbedding)) else None
        if isinstance(w, QuantizedMatrix) and id(w) not in seen:
            seen.add(id(w))
            codes += w.values.nbytes
            scales += w.scale.nbytes
            numbers += w.shape[0] * w.shape[1]
    floats = 0
    for parameter in model.parameters():
        if parameter.dtype in FLOAT_DTYPES:
            floats += parameter.data.nbytes
            numbers += parameter.data.size
    return {"codes": codes, "scales": scales, "float": floats, "total": codes + scales + floats, "float32": 4 * numbers}
