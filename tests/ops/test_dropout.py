"""Dropout (microtensor/ops/dropout.py): the share of zeros, the scale of the rest, eval mode, a
seeded generator, and the error."""
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F


def test_dropout_statistics_and_modes():
    x = mt.ones(200_000)
    y = F.dropout(x, 0.3, training=True, generator=np.random.default_rng(0)).numpy()
    assert abs((y == 0).mean() - 0.3) < 0.01
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.7], rtol=1e-6)
    assert F.dropout(x, 0.3, training=False) is x
    same = [F.dropout(x, 0.5, generator=np.random.default_rng(7)).numpy() for _ in range(2)]
    np.testing.assert_array_equal(*same)
    with pytest.raises(ValueError, match=r"dropout: p must be in \[0, 1\)"):
        F.dropout(x, 1.0)
