"""The embedding (microtensor/ops/embedding.py): the gather and its scatter-add, through the op and
the kernels called directly. The checks it shares with the other fused ops (PyTorch, the errors)
are in test_fused_ops.py. Tests taking `kernel_set` run once with each kernel set."""
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor.kernels import active
from microtensor.ops import embedding
from helpers import randn


def test_embedding_and_its_scatter_add(kernel_set):
    w = mt.tensor(randn(5, 3), requires_grad=True)
    ids = mt.tensor(np.array([[0, 4, 0], [0, 2, 4]]))
    y = F.embedding(ids, w)
    np.testing.assert_array_equal(y.numpy(), w.numpy()[ids.numpy()])
    y.backward(np.ones((2, 3, 3)))
    np.testing.assert_array_equal(w.grad[:, 0], [3.0, 0.0, 1.0, 0.0, 2.0])  # id 0 appears three times


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_embedding_kernels_by_plain_indexing(dtype, kernel_set):
    """The gather is weight[ids] exactly, and the scatter-add adds each position's gradient row into
    its id's row, in position order (np.add.at adds in the same order: equal to the last bit)."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((11, 130)).astype(dtype)
    ids = rng.integers(0, 11, 300)  # ids repeat: rows collect several gradients
    y = np.empty((300, 130), dtype)
    active(embedding.embedding_forward)(ids, weight, y)
    np.testing.assert_array_equal(y, weight[ids])
    g = rng.standard_normal((300, 130)).astype(dtype)
    grad_weight = np.full_like(weight, np.nan)  # the kernel zeroes it first
    active(embedding.embedding_backward)(g, ids, grad_weight)
    expected = np.zeros_like(weight)
    np.add.at(expected, ids, g)
    np.testing.assert_array_equal(grad_weight, expected)
    assert active(embedding.first_id_out_of_range)(ids, 11) == -1
    assert active(embedding.first_id_out_of_range)(np.array([0, 3, 11, -1]), 11) == 2
