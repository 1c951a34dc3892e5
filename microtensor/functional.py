"""The functional API: `import microtensor.functional as F`.

Every function here is defined, with its math and its backward, in one file of `microtensor/ops/`:
the ops the default GPT runs at the top of ops/, the techniques in `ops/electives/`. Each checks
its arguments before any kernel sees them (microtensor/checks.py) and raises a
`microtensor.MicrotensorError` that names the function, what was given and what was expected.
"""
from .ops.elementwise import add, cast, div, exp, log, mul, neg, pow, relu, sigmoid, sqrt, sub, tanh
from .ops.matmul import matmul
from .ops.reduce import max, mean, sum
from .ops.shape import cat, concat, flatten, getitem, masked_fill, permute, reshape, split, stack, transpose, where
from .ops.softmax import log_softmax, softmax, softmax_jacobian
from .ops.cross_entropy import cross_entropy
from .ops.layer_norm import layer_norm
from .ops.gelu import gelu
from .ops.embedding import embedding
from .ops.dropout import dropout
from .ops.attention import alibi_slopes, multi_head_attention, scaled_dot_product_attention

# the techniques (ops/electives/)
from .ops.electives.rms_norm import rms_norm
from .ops.electives.silu import silu, swiglu
from .ops.electives.online_attention import multi_head_online_attention, online_attention
from .ops.electives.rope import rope
from .ops.electives.lora import lora_linear
from .ops.electives.moe import gather_rows, scatter_add_rows, top_k_experts, top_k_gates
from .ops.electives.dpo_loss import dpo_loss
from .ops.electives.selective_scan import selective_scan
