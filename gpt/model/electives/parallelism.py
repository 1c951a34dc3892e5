"""Splitting a model across machines, as mathematics you can check on one (docs/electives/parallelism.md).

Here a "rank" (one machine, one GPU) is a list index: a value that k ranks hold is a *rank list*,
a Python list of k Tensors, entry r being what rank r holds. Three kinds of rank lists appear:

    replicated   every rank holds the same tensor (the input of a column-parallel layer)
    sharded      rank r holds slice r of a tensor along its last dim (W's columns, a head group)
    partial      rank r holds a term of a sum; the tensor is the sum over ranks (row-parallel outputs)

The collectives move between them. Each is a linear map from the k ranks' tensors to the k ranks'
tensors, so its backward is its adjoint (its transpose), which is again a collective:

    all_gather      sharded -> replicated      y_r = concat_i(x_i)          backward: reduce-scatter
    reduce_scatter  partial -> sharded         y_i = Σ_r x_r[slice i]       backward: all-gather
    all_reduce      partial -> replicated      y_r = Σ_i x_i                backward: all-reduce
    broadcast       one tensor -> replicated   y_r = x                      backward: Σ_r (an all-reduce)
    split           one tensor -> sharded      y_i = x[slice i]             backward: concat (an all-gather)

Derivation of the first: all-gather's output on rank r holds x_i at slice i, for every r. So
x_i reaches the loss through k copies, and its gradient is the sum of the k copies' gradients at
slice i: x̄_i = Σ_r ȳ_r[slice i], which is reduce-scatter applied to (ȳ_0 .. ȳ_k-1). Transposing
the matrix of a linear map swaps "copy to many" with "sum from many": that is why all-gather and
reduce-scatter are each other's backward, and why all-reduce (sum, then copy) is its own.

Every collective is a Function whose forward is the numpy collective (the `*_arrays` functions: what
the wire carries), whose backward is its adjoint's forward, and whose `jvp` is the forward itself
(a linear map's derivative is the map). The k output tensors of a collective are rows of one
stacked array (k, ...), taken apart by indexing, whose backward puts each rank's gradient back in
its row: a Function returns one tensor.

The layers built from them (each from an unsplit layer, whose weights it copies into per-rank
Parameters), and every one gives the unsplit layer's outputs and gradients (tests/electives/test_parallelism.py):

    ColumnParallelLinear    W (in, out) split by output columns: y_r = x W_r, then all-gather
    RowParallelLinear       W split by input rows, x sharded alike: Σ_r x_r W_r, an all-reduce
    TensorParallelMLP       Megatron's pairing: column (no gather) then row: one all-reduce
    TensorParallelAttention heads split over the ranks: c_attn by columns, c_proj by rows
    TensorParallelGPT       a whole GPT, every block split so, the rest replicated
    data_parallel_gradients each rank a batch shard; gradients all-reduced and averaged
    pipeline_step           blocks split into p stages, the batch into m micro-batches, GPipe's schedule
    zero_memory_per_rank    ZeRO stages 1-3: what each shards, bytes per rank

Simulated ranks hold tiny models in one process: this is for understanding, not for speed.
"""
import copy
import math
from contextlib import contextmanager

import numpy as np

import microtensor as mt
import microtensor.functional as F
from microtensor import InputError, InputTypeError, nn
from microtensor.checks import is_integer

# ================================================================================ argument checks


def check_count(where, name, value, at_least=1):
    """An int >= at_least (a rank, stage or micro-batch count), or an InputError naming `name`."""
    if not is_integer(value) or isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"{where}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < at_least:
        raise InputError(f"{where}: {name} must be an int >= {at_least}, got {value}")
    return int(value)


def check_divides(where, name, ranks, size, what):
    """`ranks` must divide `size` (each rank takes an equal slice of `what`)."""
    if size % ranks != 0:
        raise InputError(f"{where}: {name} ({ranks}) must divide {what} ({size}): each rank takes an equal share")


def check_rank_list(where, tensors, ranks=None):
    """A list (or tuple) of Tensors of one shape and dtype, one per rank."""
    if not isinstance(tensors, (list, tuple)) or not tensors or not all(isinstance(t, mt.Tensor) for t in tensors):
        raise InputTypeError(f"{where}: expected a rank list (a list of Tensors, one per rank), got {type(tensors).__name__}")
    if ranks is not None and len(tensors) != ranks:
        raise InputError(f"{where}: a rank list of {len(tensors)} tensors, expected one per rank ({ranks})")
    first = tensors[0]
    for r, t in enumerate(tensors):
        if t.shape != first.shape or t.dtype != first.dtype:
            raise InputError(f"{where}: rank {r} holds {t.dtype} {t.shape}, rank 0 holds {first.dtype} {first.shape}; expected the same")
    return list(tensors)


# ================================================================================ what the wire carries


def all_gather_arrays(shards):
    """k arrays (..., n) -> k equal arrays (..., k n): every rank gets the shards side by side."""
    full = np.concatenate(shards, axis=-1)
    return [full.copy() for _ in shards]


def reduce_scatter_arrays(partials):
    """k arrays (..., k n) -> k arrays (..., n): rank i gets slice i of the sum over ranks."""
    k, n = len(partials), partials[0].shape[-1] // len(partials)
    return [sum(p[..., i * n : (i + 1) * n] for p in partials) for i in range(k)]


def all_reduce_arrays(partials):
    """k arrays -> k equal arrays: the sum over ranks, on every rank (summed in rank order)."""
    total = partials[0].copy()
    for p in partials[1:]:
        total += p
    return [total.copy() for _ in partials]


# ================================================================================ the collectives, differentiable

counts = None  # under count_collectives(): {name: calls} of the collectives' forwards


@contextmanager
def count_collectives():
    """Count the collectives the forwards inside make: `with count_collectives() as calls: ...`,
    then calls["all_reduce"] is how many all-reduces ran (their backwards are not counted)."""
    global counts
    outer, counts = counts, {}
    try:
        yield counts
    finally:
        counts = outer


def _count(name):
    if counts is not None:
        counts[name] = counts.get(name, 0) + 1


def _tangents(ctx_shapes, tangents):
    """One array per rank: a rank without a tangent moves by zeros."""
    dtype = next(t.dtype for t in tangents if t is not None)
    return [np.zeros(shape, dtype=dtype) if t is None else t for shape, t in zip(ctx_shapes, tangents)]


class AllGather(mt.Function):
    """Sharded (k × (..., n)) -> replicated, stacked (k, ..., k n). Backward: reduce-scatter."""

    @staticmethod
    def forward(ctx, *shards):
        ctx.shapes = [s.shape for s in shards]
        _count("all_gather")
        return np.stack(all_gather_arrays(shards))

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(reduce_scatter_arrays(list(grad_out)))  # x̄_i = Σ_r ȳ_r[slice i]

    @staticmethod
    def jvp(ctx, *tangents):
        return np.stack(all_gather_arrays(_tangents(ctx.shapes, tangents)))


class ReduceScatter(mt.Function):
    """Partial (k × (..., k n)) -> sharded, stacked (k, ..., n). Backward: all-gather."""

    @staticmethod
    def forward(ctx, *partials):
        ctx.shapes = [p.shape for p in partials]
        _count("reduce_scatter")
        return np.stack(reduce_scatter_arrays(partials))

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(all_gather_arrays(list(grad_out)))  # x̄_r[slice i] = ȳ_i for every r

    @staticmethod
    def jvp(ctx, *tangents):
        return np.stack(reduce_scatter_arrays(_tangents(ctx.shapes, tangents)))


class AllReduce(mt.Function):
    """Partial (k × (...)) -> replicated, stacked (k, ...). Backward: all-reduce (it is its own adjoint)."""

    @staticmethod
    def forward(ctx, *partials):
        ctx.shapes = [p.shape for p in partials]
        _count("all_reduce")
        return np.stack(all_reduce_arrays(partials))

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(all_reduce_arrays(list(grad_out)))  # x̄_r = Σ_i ȳ_i

    @staticmethod
    def jvp(ctx, *tangents):
        return np.stack(all_reduce_arrays(_tangents(ctx.shapes, tangents)))


class Broadcast(mt.Function):
    """One tensor -> replicated, stacked (k, ...). Backward: the sum over ranks (an all-reduce,
    when every rank needs the gradient of its copy's source, as in Megatron's "f")."""

    @staticmethod
    def forward(ctx, x, ranks):
        _count("broadcast")
        return np.stack([x] * ranks)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out.sum(axis=0), None

    @staticmethod
    def jvp(ctx, tangent, _):
        return np.stack([tangent] * ctx.inputs[1])


class Split(mt.Function):
    """One tensor (..., k n) -> sharded, stacked (k, ..., n): rank i keeps slice i. No message is
    sent (every rank already holds the tensor). Backward: the slices side by side (an all-gather)."""

    @staticmethod
    def forward(ctx, x, ranks):
        n = x.shape[-1] // ranks
        return np.stack([x[..., i * n : (i + 1) * n] for i in range(ranks)])

    @staticmethod
    def backward(ctx, grad_out):
        return np.concatenate(list(grad_out), axis=-1), None

    @staticmethod
    def jvp(ctx, tangent, _):
        return Split.forward(ctx, tangent, ctx.inputs[1])


def _ranks_of(stacked):
    return [stacked[r] for r in range(stacked.shape[0])]  # (k, ...) -> k tensors (...); backward fills row r


def all_gather(shards):
    """A sharded rank list (k × (..., n)) -> a replicated one (k × (..., k n))."""
    return _ranks_of(AllGather.apply(*check_rank_list("all_gather", shards)))


def reduce_scatter(partials):
    """A partial rank list (k × (..., k n)) -> a sharded one (k × (..., n))."""
    partials = check_rank_list("reduce_scatter", partials)
    check_divides("reduce_scatter", "the number of ranks", len(partials), partials[0].shape[-1], "the last dim")
    return _ranks_of(ReduceScatter.apply(*partials))


def all_reduce(partials):
    """A partial rank list -> a replicated one: the sum over ranks, on every rank."""
    return _ranks_of(AllReduce.apply(*check_rank_list("all_reduce", partials)))


def broadcast(x, ranks):
    """x -> a replicated rank list of `ranks` copies."""
    ranks = check_count("broadcast", "ranks", ranks)
    return _ranks_of(Broadcast.apply(x, ranks))


def split(x, ranks):
    """x (..., k n) -> a sharded rank list: rank i holds x[..., i n : (i + 1) n]."""
    ranks = check_count("split", "ranks", ranks)
    check_divides("split", "ranks", ranks, x.shape[-1], "the last dim")
    return _ranks_of(Split.apply(x, ranks))


# ================================================================================ tensor parallelism


def _parameter(array):
    """A rank's own copy of (a slice of) an unsplit weight."""
    return nn.Parameter(np.array(array, copy=True))


class LinearShard(nn.Module):
    """What one rank holds of a split Linear: y = x W_r (+ b_r)."""

    def __init__(self, weight, bias):
        super().__init__()
        self.weight = _parameter(weight)
        self.bias = None if bias is None else _parameter(bias)

    def forward(self, x):
        y = F.matmul(x, self.weight)
        return y if self.bias is None else y + self.bias


def _columns(ranks, width):
    n = width // ranks
    return [slice(r * n, (r + 1) * n) for r in range(ranks)]


class ColumnParallelLinear(nn.Module):
    """nn.Linear's W (in, out) split by output columns over k ranks: rank r holds W_r (in, out/k)
    and b_r. Forward: each rank y_r = x W_r + b_r from its copy of x (a broadcast), then, with
    gather_output, an all-gather gives every rank y = [y_0 .. y_k-1] = x W + b.

    Backward: W̄_r = xᵀ ȳ_r, local; x̄ = Σ_r ȳ_r W_rᵀ, a sum over ranks (the broadcast's backward:
    an all-reduce), because every rank's output depends on all of x.
    forward(x) -> a rank list: replicated (k × (..., out)), or sharded without gather_output."""

    def __init__(self, linear, ranks, gather_output=True):
        super().__init__()
        self.ranks = check_count("ColumnParallelLinear", "ranks", ranks)
        check_divides("ColumnParallelLinear", "ranks", self.ranks, linear.out_features, "out_features")
        self.gather_output = gather_output
        bias = linear.bias.data if linear.bias is not None else None
        self.shards = nn.ModuleList(
            [LinearShard(linear.weight.data[:, cols], None if bias is None else bias[cols]) for cols in _columns(self.ranks, linear.out_features)]
        )

    def forward(self, x):
        copies = broadcast(x, self.ranks)
        outputs = [shard(x_r) for shard, x_r in zip(self.shards, copies)]  # k × (..., out/k)
        return all_gather(outputs) if self.gather_output else outputs

    def gathered(self, what="data"):
        """The unsplit (weight, bias) arrays from the shards' values ("data") or gradients ("grad")."""
        weight = np.concatenate([getattr(s.weight, what) for s in self.shards], axis=-1)
        bias = None if self.shards[0].bias is None else np.concatenate([getattr(s.bias, what) for s in self.shards])
        return weight, bias


class RowParallelLinear(nn.Module):
    """nn.Linear's W (in, out) split by input rows: rank r holds W_r (in/k, out) and takes x_r, the
    matching slice of x's last dim. Then x W = Σ_r x_r W_r: each rank makes a partial sum, and an
    all-reduce adds them on every rank; the bias, replicated, is added once, after it.

    Backward: the all-reduce's backward is an all-reduce, and with the loss read from one copy it
    hands every rank ȳ; then W̄_r = x_rᵀ ȳ and x̄_r = ȳ W_rᵀ, both local: no other message.
    forward(x) with x a sharded rank list (k × (..., in/k)), or one tensor (split here) -> a
    replicated rank list (k × (..., out))."""

    def __init__(self, linear, ranks):
        super().__init__()
        self.ranks = check_count("RowParallelLinear", "ranks", ranks)
        check_divides("RowParallelLinear", "ranks", self.ranks, linear.in_features, "in_features")
        self.shards = nn.ModuleList([LinearShard(linear.weight.data[rows], None) for rows in _columns(self.ranks, linear.in_features)])
        self.bias = None if linear.bias is None else _parameter(linear.bias.data)

    def forward(self, x):
        shards = split(x, self.ranks) if isinstance(x, mt.Tensor) else check_rank_list("RowParallelLinear", x, self.ranks)
        partials = [shard(x_r) for shard, x_r in zip(self.shards, shards)]  # k × (..., out), summing to x W
        outputs = all_reduce(partials)
        return outputs if self.bias is None else [y + self.bias for y in outputs]

    def gathered(self, what="data"):
        weight = np.concatenate([getattr(s.weight, what) for s in self.shards], axis=0)
        return weight, None if self.bias is None else getattr(self.bias, what)


class TensorParallelMLP(nn.Module):
    """Megatron's pairing for a GELU MLP: c_fc column-parallel without the gather (rank r holds
    hidden units r), GELU on each rank's own units (elementwise: no message; SwiGLU's c_up is split
    like c_fc, and its product too is elementwise), c_proj row-parallel,
    whose rows are the same hidden units. One all-reduce per forward; in backward, one more
    (the broadcast's sum into x̄). forward(x) -> the output (..., C), rank 0's copy."""

    def __init__(self, mlp, ranks):
        super().__init__()
        if getattr(mlp, "kind", None) not in ("gelu", "swiglu"):
            raise InputError(f"TensorParallelMLP: the MLP must be a dense gelu or swiglu MLP, got {type(mlp).__name__} {getattr(mlp, 'kind', None)!r}")
        self.kind = mlp.kind
        self.c_fc = ColumnParallelLinear(mlp.c_fc, ranks, gather_output=False)
        if self.kind == "swiglu":
            self.c_up = ColumnParallelLinear(mlp.c_up, ranks, gather_output=False)
        self.c_proj = RowParallelLinear(mlp.c_proj, ranks)

    def forward(self, x):
        if self.kind == "swiglu":
            hidden = [F.swiglu(a, b) for a, b in zip(self.c_fc(x), self.c_up(x))]
        else:
            hidden = [F.gelu(h, approximate="tanh") for h in self.c_fc(x)]  # k × (..., 4C/k)
        return self.c_proj(hidden)[0]  # every rank holds the same sum: carry on with rank 0's


def _head_columns(n_head, n_kv_head, head_size, ranks):
    """For each rank, the columns of c_attn's packed output [q heads | k heads | v heads] that hold
    its query heads and its key/value heads, in the same packed order."""
    H, Hk, D = n_head, n_kv_head, head_size
    columns = []
    for r in range(ranks):
        q = np.arange(r * H // ranks * D, (r + 1) * H // ranks * D)
        k = H * D + np.arange(r * Hk // ranks * D, (r + 1) * Hk // ranks * D)
        v = (H + Hk) * D + np.arange(r * Hk // ranks * D, (r + 1) * Hk // ranks * D)
        columns.append(np.concatenate([q, k, v]))
    return columns


class TensorParallelAttention(nn.Module):
    """Attention split by heads: rank r holds H/k query heads and Hk/k key/value heads (c_attn's
    columns of those heads) and the rows of c_proj that read them. Heads never look at each other,
    so each rank runs attention on its own heads without a message; c_proj is row-parallel, and
    its all-reduce is the block's only one in forward. forward(x) -> (B, T, C), rank 0's copy."""

    def __init__(self, attention, config, ranks):
        super().__init__()
        where = "TensorParallelAttention"
        self.ranks = check_count(where, "ranks", ranks)
        check_divides(where, "ranks", self.ranks, config.n_head, "n_head")
        check_divides(where, "ranks", self.ranks, config.n_kv_head, "n_kv_head")
        self.n_head, self.n_kv_head = config.n_head // ranks, config.n_kv_head // ranks  # per rank
        self.pos, self.attend, self.attend_packed = config.pos, attention.attend, attention.attend_packed
        columns = _head_columns(config.n_head, config.n_kv_head, config.n_embd // config.n_head, ranks)
        weight, bias = attention.c_attn.weight.data, attention.c_attn.bias
        self.c_attn = nn.ModuleList([LinearShard(weight[:, c], None if bias is None else bias.data[c]) for c in columns])
        self.columns = columns
        slopes = attention.alibi_slopes
        self.alibi_slopes = None if slopes is None else [slopes[r * self.n_head : (r + 1) * self.n_head] for r in range(ranks)]
        self.c_proj = RowParallelLinear(attention.c_proj, ranks)

    def forward(self, x):
        B, T, C = x.shape
        H, Hk = self.n_head, self.n_kv_head
        outputs = []
        for r, (shard, x_r) in enumerate(zip(self.c_attn, broadcast(x, self.ranks))):
            qkv = shard(x_r)  # (B, T, (H + 2 Hk) D): this rank's heads, packed as c_attn packs them all
            slopes = None if self.alibi_slopes is None else self.alibi_slopes[r]
            if self.pos != "rope":
                outputs.append(self.attend_packed(qkv, H, n_kv_head=Hk, alibi_slopes=slopes))  # (B, T, H D)
                continue
            heads = qkv.reshape(B, T, H + 2 * Hk, -1).permute(0, 2, 1, 3)  # (B, H + 2 Hk, T, D)
            q, k, v = F.rope(heads[:, :H], 0), F.rope(heads[:, H : H + Hk], 0), heads[:, H + Hk :]
            y = self.attend(q, k, v, causal=True, alibi_slopes=slopes)  # (B, H, T, D)
            outputs.append(y.permute(0, 2, 1, 3).reshape(B, T, -1))
        return self.c_proj(outputs)[0]

    def gathered_c_attn(self, what="data"):
        """c_attn's unsplit (weight, bias), its columns put back where they came from."""
        width = sum(len(c) for c in self.columns)
        weight = np.empty((self.c_attn[0].weight.shape[0], width))
        bias = None if self.c_attn[0].bias is None else np.empty(width)
        for shard, cols in zip(self.c_attn, self.columns):
            weight[:, cols] = getattr(shard.weight, what)
            if bias is not None:
                bias[cols] = getattr(shard.bias, what)
        return weight, bias


class TensorParallelBlock(nn.Module):
    """A transformer block over k ranks: the norms replicated (each rank computes them alike; the
    simulation once), attention split by heads, the MLP by hidden units: two all-reduces in forward."""

    def __init__(self, block, config, ranks):
        super().__init__()
        self.ln_1, self.ln_2 = copy.deepcopy(block.ln_1), copy.deepcopy(block.ln_2)
        self.attn = TensorParallelAttention(block.attn, config, ranks)
        self.mlp = TensorParallelMLP(block.mlp, ranks)
        self.zero_grad()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def check_tensor_parallel_config(config, ranks):
    """The options a tensor-parallel GPT here supports, and a rank count that divides the heads and the width."""
    where = "TensorParallelGPT"
    ranks = check_count(where, "ranks", ranks)
    for name, size in (("n_head", config.n_head), ("n_kv_head", config.n_kv_head), ("n_embd", config.n_embd)):
        check_divides(where, "ranks", ranks, size, name)
    if config.mlp == "moe":
        raise InputError(f"{where}: mlp 'moe' is not split here (experts split by expert, not by columns); expected 'gelu' or 'swiglu'")
    if config.dropout != 0:
        raise InputError(f"{where}: dropout must be 0, got {config.dropout}: each rank would draw its own masks")
    if config.mtp != 1 or config.checkpoint_activations:
        raise InputError(
            f"{where}: mtp {config.mtp} and checkpoint_activations {config.checkpoint_activations} are not split here; "
            "expected mtp 1 and checkpoint_activations False"
        )
    return ranks


class TensorParallelGPT(nn.Module):
    """A GPT's forward and backward over k simulated ranks, from an unsplit `model` whose weights it
    copies: every block's attention split by heads and its MLP by hidden units (Megatron's layout);
    the embeddings, the norms and the output layer replicated. forward(idx, targets) -> (logits, loss),
    equal to model(idx, targets), and so are the gradients (`gathered_gradients`)."""

    def __init__(self, model, ranks):
        super().__init__()
        self.config = model.config
        self.ranks = check_tensor_parallel_config(model.config, ranks)
        self.wte = copy.deepcopy(model.transformer.wte)
        self.wpe = copy.deepcopy(model.transformer.wpe) if "wpe" in model.transformer else None
        self.h = nn.ModuleList([TensorParallelBlock(block, model.config, self.ranks) for block in model.transformer.h])
        self.ln_f = copy.deepcopy(model.transformer.ln_f)
        self.lm_head = None if model.config.tie_weights else copy.deepcopy(model.lm_head)
        self.zero_grad()  # the copies start without the unsplit model's gradients

    def forward(self, idx, targets=None):
        idx = idx if isinstance(idx, mt.Tensor) else mt.tensor(np.asarray(idx))
        T = idx.shape[1]
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(mt.arange(T))
        elif self.config.pos == "sinusoidal":
            x = x + mt.tensor(nn.sinusoidal_embedding(0, T, self.config.n_embd, x.dtype))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.T if self.lm_head is None else self.lm_head(x)  # (B, T, V)
        return logits, None if targets is None else F.cross_entropy(logits, targets)

    def gathered_gradients(self, what="grad"):
        """{name: array} in the unsplit GPT's names and shapes: the shards' gradients (or, with
        what="data", weights) put back together, to compare with the unsplit model's."""
        out = {"transformer.wte.weight": getattr(self.wte.weight, what)}
        out.update({f"transformer.ln_f.{name}": getattr(p, what) for name, p in self.ln_f.named_parameters()})
        if self.wpe is not None:
            out["transformer.wpe.weight"] = getattr(self.wpe.weight, what)
        if self.lm_head is not None:
            out["lm_head.weight"] = getattr(self.lm_head.weight, what)
        for i, block in enumerate(self.h):
            prefix = f"transformer.h.{i}."
            for norm in ("ln_1", "ln_2"):
                for name, p in getattr(block, norm).named_parameters():
                    out[f"{prefix}{norm}.{name}"] = getattr(p, what)
            parts = {"attn.c_attn": block.attn.gathered_c_attn(what), "attn.c_proj": block.attn.c_proj.gathered(what)}
            parts["mlp.c_fc"], parts["mlp.c_proj"] = block.mlp.c_fc.gathered(what), block.mlp.c_proj.gathered(what)
            if block.mlp.kind == "swiglu":
                parts["mlp.c_up"] = block.mlp.c_up.gathered(what)
            for name, (weight, bias) in parts.items():
                out[f"{prefix}{name}.weight"] = weight
                if bias is not None:
                    out[f"{prefix}{name}.bias"] = bias
        return out


# ================================================================================ data parallelism


def data_parallel_gradients(model, idx, targets, ranks):
    """One data-parallel step's gradients: k copies of `model` (every rank holds all the weights),
    rank r runs forward and backward on batch rows r B/k .. (r+1) B/k - 1, then the gradients are
    all-reduced and divided by k. The loss is a mean over tokens, and equal shards make the mean of
    the k shard means the mean over the batch: so the result is the full batch's gradient.
    Returns {name: gradient}, what every rank holds after the all-reduce (the copies' .grad too)."""
    ranks = check_count("data_parallel_gradients", "ranks", ranks)
    idx, targets = np.asarray(idx.data if isinstance(idx, mt.Tensor) else idx), np.asarray(targets.data if isinstance(targets, mt.Tensor) else targets)
    check_divides("data_parallel_gradients", "ranks", ranks, idx.shape[0], "the batch size")
    replicas = [copy.deepcopy(model) for _ in range(ranks)]
    rows = idx.shape[0] // ranks
    for r, replica in enumerate(replicas):
        replica.zero_grad()
        _, loss = replica(idx[r * rows : (r + 1) * rows], targets[r * rows : (r + 1) * rows])
        loss.backward()
    names = [name for name, _ in model.named_parameters()]
    per_rank = [dict(replica.named_parameters()) for replica in replicas]
    for name in names:
        averaged = all_reduce_arrays([params[name].grad for params in per_rank])
        for params, grad in zip(per_rank, averaged):
            params[name].grad = grad / ranks
    return {name: per_rank[0][name].grad for name in names}


# ================================================================================ pipeline parallelism


def gpipe_schedule(stages, micro_batches):
    """GPipe's schedule for p stages and m micro-batches: a list of ticks, each a list of
    (stage, micro_batch, "forward" or "backward") that run at once. Forward: stage s takes
    micro-batch j at tick s + j (it needs stage s-1's output of j). Backward, after the last
    forward: the last stage starts, each stage takes the micro-batches in reverse order, stage s
    reaching micro-batch j at tick F + (p-1-s) + (m-1-j), F = m + p - 1 the forward's ticks."""
    p = check_count("gpipe_schedule", "stages", stages)
    m = check_count("gpipe_schedule", "micro_batches", micro_batches)
    forward_ticks = m + p - 1
    ticks = [[] for _ in range(2 * forward_ticks)]
    for s in range(p):
        for j in range(m):
            ticks[s + j].append((s, j, "forward"))
            ticks[forward_ticks + (p - 1 - s) + (m - 1 - j)].append((s, j, "backward"))
    return ticks


def bubble_fraction(schedule, stages):
    """The share of stage-ticks spent idle in `schedule`: counted, not computed from the formula."""
    busy = sum(len(work) for work in schedule)
    return 1 - busy / (stages * len(schedule))


def bubble_table(stage_counts=(2, 4, 8), micro_batch_counts=(1, 4, 8, 32)):
    """Rows (p, m, ticks, idle stage-ticks, measured bubble, (p-1)/(m+p-1)) of GPipe's schedule."""
    rows = []
    for p in stage_counts:
        for m in micro_batch_counts:
            schedule = gpipe_schedule(p, m)
            idle = p * len(schedule) - sum(len(work) for work in schedule)
            rows.append((p, m, len(schedule), idle, bubble_fraction(schedule, p), (p - 1) / (m + p - 1)))
    return rows


def bubble_markdown():
    """bubble_table() as the markdown table of docs/electives/parallelism.md."""
    lines = ["| stages p | micro-batches m | ticks | idle stage-ticks | bubble, counted | (p−1)/(m+p−1) |", "|---|---|---|---|---|---|"]
    for p, m, ticks, idle, measured, formula in bubble_table():
        lines.append(f"| {p} | {m} | {ticks} | {idle} | {measured:.4f} | {formula:.4f} |")
    return "\n".join(lines)


def stage_layers(n_layer, stages):
    """The blocks each stage holds: `stages` runs of consecutive layers, as equal as they can be."""
    return [list(part) for part in np.array_split(np.arange(n_layer), stages)]


def pipeline_step(model, idx, targets, stages, micro_batches, trace=None):
    """Forward and backward of one step of `model` split into p stages (stage 0 also holds the
    embeddings, the last one ln_f and the output layer) on m micro-batches, run tick by tick in
    GPipe's schedule. Between stages only activations travel forward and their gradients back:
    each stage's input is a fresh leaf, whose .grad is what it sends to the stage before.
    Each micro-batch's loss is divided by m, so the parameters' accumulated .grad is the full
    batch's (the loss is a mean and the micro-batches are equal). Returns the batch's mean loss.
    trace: a list, to which each tick's work is appended as it runs."""
    where = "pipeline_step"
    p = check_count(where, "stages", stages)
    m = check_count(where, "micro_batches", micro_batches)
    config = model.config
    if p > config.n_layer:
        raise InputError(f"{where}: stages ({p}) must be at most n_layer ({config.n_layer}): each stage holds at least one block")
    if config.dropout != 0 or config.mtp != 1 or config.mlp == "moe" or config.checkpoint_activations:
        given = f"dropout {config.dropout}, mtp {config.mtp}, mlp {config.mlp!r}, checkpoint_activations {config.checkpoint_activations}"
        raise InputError(f"{where}: the stages run the blocks as they are; got {given}, expected dropout 0, mtp 1, no experts and no checkpointing")
    idx, targets = np.asarray(idx), np.asarray(targets)
    check_divides(where, "micro_batches", m, idx.shape[0], "the batch size")
    rows = idx.shape[0] // m
    layers = stage_layers(config.n_layer, p)
    received, sent, losses = {}, {}, {}  # (stage, micro-batch) -> the stage's input leaf, its output

    def run_forward(s, j):
        if s == 0:
            ids = idx[j * rows : (j + 1) * rows]
            x = model.transformer.wte(mt.tensor(ids))
            if config.pos == "learned":
                x = x + model.transformer.wpe(mt.arange(ids.shape[1]))
            elif config.pos == "sinusoidal":
                x = x + mt.tensor(nn.sinusoidal_embedding(0, ids.shape[1], config.n_embd, x.dtype))
        else:
            x = received[s, j] = mt.tensor(sent[s - 1, j].data, requires_grad=True)  # what came over the wire
        for layer in layers[s]:
            x = model.transformer.h[layer](x)
        if s == p - 1:
            losses[s, j] = F.cross_entropy(model.logits_of(x), mt.tensor(targets[j * rows : (j + 1) * rows])) * (1.0 / m)
        else:
            sent[s, j] = x

    def run_backward(s, j):
        if s == p - 1:
            losses[s, j].backward()
        else:
            sent[s, j].backward(received.pop((s + 1, j)).grad)  # the gradient the next stage sent back
            del sent[s, j]

    for work in gpipe_schedule(p, m):
        for s, j, direction in work:
            (run_forward if direction == "forward" else run_backward)(s, j)
        if trace is not None:
            trace.append(work)
    return sum(loss.item() for loss in losses.values())


# ================================================================================ ZeRO


def zero_memory_per_rank(n_params, ranks, stage, weight_bytes=2, grad_bytes=2, optimizer_bytes=12):
    """Bytes each of `ranks` data-parallel ranks holds for the model's state under ZeRO `stage`
    (0: plain data parallelism), by part: {"weights", "gradients", "optimizer", "total"}.

    Mixed-precision AdamW keeps, per parameter: the 16-bit weights (2 bytes) and gradients (2) that
    forward and backward use, and the optimizer's state: float32 master weights, first and second
    moments (4 + 4 + 4 = 12). Plain data parallelism replicates all of it: 16 N per rank. ZeRO
    partitions it over the ranks, each rank owning 1/k of the parameters' updates:
      stage 1 shards the optimizer state: a rank updates only its own slice, so it needs the
              moments and master weights of that slice alone: 2N + 2N + 12N/k
      stage 2 shards the gradients too: they are reduce-scattered (not all-reduced), each rank
              keeping the slice it updates: 2N + (2 + 12)N/k
      stage 3 shards the weights too: each layer's weights are all-gathered just before its
              forward (and again its backward) and dropped after: (2 + 2 + 12)N/k
    Activations and temporary buffers (a layer's gathered weights) are not counted."""
    ranks = check_count("zero_memory_per_rank", "ranks", ranks)
    if not is_integer(stage) or stage not in (0, 1, 2, 3):
        raise InputError(f"zero_memory_per_rank: stage must be 0, 1, 2 or 3, got {stage!r}")
    shard = [1, 1, 1]  # divisors of weights, gradients, optimizer state
    for s in range(1, stage + 1):
        shard[3 - s] = ranks  # stage 1 -> optimizer, 2 -> gradients, 3 -> weights
    parts = {
        "weights": n_params * weight_bytes / shard[0],
        "gradients": n_params * grad_bytes / shard[1],
        "optimizer": n_params * optimizer_bytes / shard[2],
    }
    parts["total"] = sum(parts.values())
    return parts


def gpt2_small_config():
    """GPT-2's 124M model: 12 layers of width 768, 12 heads, 1024 positions, biases, tied embeddings."""
    from gpt.model.transformer import GPTConfig

    return GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, bias=True)


def zero_table(ranks=8):
    """Rows (model, parameters, stage, weights, gradients, optimizer, total) in bytes per rank, for
    the default model (character vocabulary of 65) and GPT-2 small, over `ranks` ranks."""
    from gpt.model.transformer import GPTConfig, parameter_count

    rows = []
    for name, config in (("default", GPTConfig(vocab_size=65)), ("GPT-2 small", gpt2_small_config())):
        n = parameter_count(config)
        for stage in range(4):
            parts = zero_memory_per_rank(n, ranks, stage)
            rows.append((name, n, stage, parts["weights"], parts["gradients"], parts["optimizer"], parts["total"]))
    return rows


def zero_markdown(ranks=8):
    """zero_table() as the markdown table of docs/electives/parallelism.md (MB = 10^6 bytes)."""
    lines = [
        f"| model | parameters | ZeRO stage | weights | gradients | optimizer state | total per rank (k = {ranks}) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, n, stage, weights, grads, optimizer, total in zero_table(ranks):
        stage_name = "0 (plain data parallel)" if stage == 0 else str(stage)
        cells = " | ".join(f"{v / 1e6:.2f} MB" for v in (weights, grads, optimizer, total))
        lines.append(f"| {name} | {n:,} | {stage_name} | {cells} |")
    return "\n".join(lines)
