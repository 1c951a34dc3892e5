"""Continue training a microtensor GPT in PyTorch, on one or several processes or machines (DDP or FSDP).

    python -m gpt.checkpoints.convert out/ model.safetensors                     # in microtensor: export
    torchrun --standalone --nproc_per_node 2 examples/train_torch_ddp.py model.safetensors \\
        --data input.txt --steps 200 --out trained.safetensors           # 2 processes, one computer
    torchrun --standalone --nproc_per_node 2 examples/train_torch_ddp.py model.safetensors --fsdp \\
        --data input.txt --steps 200 --out trained.safetensors           # the same, sharded (ZeRO-3)
    python -m gpt.checkpoints.convert trained.safetensors out2/                  # back into microtensor

On several machines, run the same command on each with --nnodes, --node_rank and the address of the
first (docs/pytorch.md shows it). Every process holds the whole model, draws its own batches, and
DistributedDataParallel averages the gradients over all of them in backward, so each step learns from
batch_size × world_size sequences and every copy of the model takes the same step.

With --fsdp, FullyShardedDataParallel (ZeRO stage 3) replaces DDP: each process keeps 1/world_size of
every weight, of its gradient and of AdamW's moments; a block's weights are all-gathered just before
its forward and its backward and freed after, and the gradients are reduce-scattered, each process
receiving the average of its own slice (docs/electives/parallelism.md derives why). The steps are
the same as DDP's; the memory per process is what shrinks.

This file needs only torch and numpy (and safetensors for .safetensors files): copy it, with the
export and the text, to machines where microtensor is not installed. The model below mirrors
gpt/model/transformer.py for every option the export's config may hold (norm, mlp, pos, bias, tie_weights),
with nanoGPT's names; tests/test_convert.py checks that it computes microtensor's logits.
"""
import argparse
import gc
import json
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

# ================================================================================= the model


def rope(x, base=10000.0):
    """Rotary positions: rotate each pair (x_2i, x_2i+1) of x (B, H, T, D) by t θ_i, θ_i = base^(-2i/D)."""
    T, D = x.shape[-2], x.shape[-1]
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)  # (D/2,)
    angle = torch.arange(T, dtype=torch.float64, device=x.device)[:, None] * theta  # (T, D/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def make_norm(config):
    if config["norm"] == "rmsnorm":
        return nn.RMSNorm(config["n_embd"], eps=1e-5)
    return nn.LayerNorm(config["n_embd"], eps=1e-5, bias=config["bias"])


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        C = config["n_embd"]
        self.n_head, self.rope = config["n_head"], config["pos"] == "rope"
        self.c_attn = nn.Linear(C, 3 * C, bias=config["bias"])
        self.c_proj = nn.Linear(C, C, bias=config["bias"])
        self.resid_dropout = nn.Dropout(config["dropout"])

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if self.rope:
            q, k = rope(q), rope(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        C = config["n_embd"]
        self.swiglu = config["mlp"] == "swiglu"
        hidden = 8 * math.ceil(8 * C / 3 / 8) if self.swiglu else 4 * C
        self.c_fc = nn.Linear(C, hidden, bias=config["bias"])
        if self.swiglu:
            self.c_up = nn.Linear(C, hidden, bias=config["bias"])  # microtensor's name for SwiGLU's second projection
        self.c_proj = nn.Linear(hidden, C, bias=config["bias"])
        self.dropout = nn.Dropout(config["dropout"])

    def forward(self, x):
        h = F.silu(self.c_fc(x)) * self.c_up(x) if self.swiglu else F.gelu(self.c_fc(x), approximate="tanh")
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = make_norm(config), CausalSelfAttention(config)
        self.ln_2, self.mlp = make_norm(config), MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        C = config["n_embd"]
        parts = {"wte": nn.Embedding(config["vocab_size"], C)}
        if config["pos"] == "learned":
            parts["wpe"] = nn.Embedding(config["block_size"], C)
        parts["drop"] = nn.Dropout(config["dropout"])
        parts["h"] = nn.ModuleList(Block(config) for _ in range(config["n_layer"]))
        parts["ln_f"] = make_norm(config)
        self.transformer = nn.ModuleDict(parts)
        self.lm_head = nn.Linear(C, config["vocab_size"], bias=False)
        if config["tie_weights"]:
            self.lm_head.weight = self.transformer.wte.weight  # tied, as in nanoGPT

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device))
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


# ================================================================================= the file


def read_export(path):
    """(tensors {name: tensor}, metadata {key: str}) of a file written by `python -m gpt.checkpoints.convert`."""
    if str(path).endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}, f.metadata()
    with np.load(path, allow_pickle=False) as archive:
        metadata = json.loads(str(archive["__metadata__"]))
        return {name: torch.from_numpy(archive[name]) for name in archive.files if name != "__metadata__"}, metadata


def load_model(path):
    """(GPT with the file's weights, in the file's dtype, metadata)."""
    tensors, metadata = read_export(path)
    for name, source in json.loads(metadata["tied_weights"]).items():
        tensors[name] = tensors[source]  # a tied tensor is stored once
    model = GPT(json.loads(metadata["config"])).to(next(iter(tensors.values())).dtype)
    model.load_state_dict(tensors)
    return model, metadata


def save_model(model, metadata, path, state=None):
    """Write the model in the layout it was read in: the same metadata, a tied tensor stored once;
    `python -m gpt.checkpoints.convert path out/` imports it. Written to a temporary file first, then renamed.
    state: the full state dict to write instead of model.state_dict() (FSDP's, gathered from every process)."""
    tied = json.loads(metadata["tied_weights"])
    state = model.state_dict() if state is None else state
    state = {name: t.detach().cpu().contiguous() for name, t in state.items() if name not in tied}
    tmp = f"{path}.tmp{os.path.splitext(str(path))[1]}"
    if str(path).endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, tmp, metadata=metadata)
    else:
        np.savez(tmp, **{name: t.numpy() for name, t in state.items()}, __metadata__=np.array(json.dumps(metadata)))
    os.replace(tmp, path)


# ================================================================================= training


def get_batch(ids, block_size, batch_size, rng):
    """x, y (batch_size, block_size): windows of the text at random places, y one character ahead."""
    starts = rng.integers(0, len(ids) - block_size, batch_size)
    x = np.stack([ids[s : s + block_size] for s in starts])
    y = np.stack([ids[s + 1 : s + 1 + block_size] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


def build_parser():
    p = argparse.ArgumentParser(description="Train a GPT exported by microtensor (python -m gpt.checkpoints.convert) with PyTorch DDP.")
    p.add_argument("export", help="the .safetensors or .npz file written by python -m gpt.checkpoints.convert")
    p.add_argument("--data", required=True, help="a UTF-8 text file whose characters are all in the export's vocabulary")
    p.add_argument("--out", required=True, help="where to write the trained model (.safetensors or .npz), importable again")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=12, help="sequences per step and process")
    p.add_argument("--learning-rate", type=float, default=1e-3, help="AdamW learning rate (constant)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decoupled weight decay, on matrices only")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--grad-clip", type=float, default=1.0, help="clip the global gradient norm (0: off)")
    p.add_argument("--log-interval", type=int, default=10, help="print the loss, averaged over processes, every this many steps")
    p.add_argument("--seed", type=int, default=1337, help="process r draws its batches from seed + r")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--fsdp", action="store_true", help="shard weights, gradients and AdamW's moments over the processes (FSDP, ZeRO-3) instead of DDP")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    # torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; run without it, this is one process of one.
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        # gloo runs on CPUs, nccl on NVIDIA GPUs; both reach the other processes over the network
        dist.init_process_group(backend="nccl" if args.device == "cuda" else "gloo")
        rank, world_size, local_rank = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
    else:
        rank, world_size, local_rank = 0, 1, 0
    device = torch.device(f"cuda:{local_rank}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)  # dropout masks; the weights come from the file

    model, metadata = load_model(args.export)
    model.to(device)
    vocab = json.loads(metadata["vocab"])
    index = {c: i for i, c in enumerate(vocab)}
    with open(args.data, encoding="utf-8") as f:
        text = f.read()
    unknown = sorted(set(text) - index.keys())
    if unknown:
        raise SystemExit(f"{args.data}: characters not in the model's vocabulary: {''.join(unknown)!r}")
    ids = np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
    block_size = model.config["block_size"]
    if len(ids) <= block_size:
        raise SystemExit(f"{args.data}: {len(ids)} characters, fewer than block_size + 1 = {block_size + 1}")

    # DDP broadcasts rank 0's weights at construction (they are equal anyway: all read one file) and
    # all-reduces (averages) the gradients during backward, bucket by bucket as they are ready.
    # FSDP (fully_shard) instead cuts every weight into world_size slices along its first dim, one per
    # process: each block is a unit whose weights are gathered for its forward and backward only, and
    # the root unit holds the rest (the embeddings, tied to the output layer, and ln_f).
    sharded = distributed and args.fsdp
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
        trained = model
    else:
        trained = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None) if distributed else model
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings, as microtensor's weight_decay_groups
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # norm weights and biases
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.learning_rate, betas=(args.beta1, args.beta2),
    )  # fmt: skip
    rng = np.random.default_rng(args.seed + rank)  # each process its own batches
    start_iteration = int(metadata.get("iteration", "0"))
    if rank == 0:
        # under FSDP, p.numel() is the whole weight's count (a DTensor), not this process's slice
        print(f"{world_size} process(es){', FSDP' if sharded else ''}, {sum(p.numel() for p in model.parameters()):,} parameters, from step {start_iteration}")
    started = time.perf_counter()
    model.train()
    for step in range(1, args.steps + 1):
        x, y = get_batch(ids, block_size, args.batch_size, rng)
        _, loss = trained(x.to(device), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # under DDP, every process now holds the average gradient; under FSDP, its slice of it
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        if step % args.log_interval == 0 or step in (1, args.steps):
            mean_loss = loss.detach().clone()
            if distributed:
                dist.all_reduce(mean_loss)
                mean_loss /= world_size
            if rank == 0:
                print(f"step {start_iteration + step}: loss {mean_loss.item():.4f}  ({time.perf_counter() - started:.1f} s)", flush=True)
    state = None
    if sharded:  # every process takes part in gathering the slices; process 0 receives the whole weights
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        # tensor_sha256 describes the weights that were read, which training changed: it goes
        metadata = {**{k: v for k, v in metadata.items() if k != "tensor_sha256"}, "iteration": str(start_iteration + args.steps)}
        save_model(model, metadata, args.out, state)
        print(f"wrote {args.out}: import it with python -m gpt.checkpoints.convert {args.out} <folder>")
    if distributed:
        dist.barrier()  # rank 0 has written the file: every process leaves at the same point
        # DDP's reducer uses the process group, so it goes first. DDP holds reference cycles (its
        # hooks), so `del` alone leaves it for the interpreter's exit, after the group is gone,
        # where its threads can abort the process: collect it now.
        del trained
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
