"""A gradcheck `draw` whose choices come from hypothesis, so failing cases shrink and replay."""
from hypothesis import strategies as st

from microtensor.gradcheck import RandomDraw


class HypothesisDraw(RandomDraw):
    """Integers (and so shapes, dims, layouts and choices) are drawn by hypothesis; the values
    inside tensors come from a numpy generator whose seed hypothesis draws."""

    def __init__(self, data):
        self.data = data
        super().__init__(seed=data.draw(st.integers(0, 2**32 - 1), label="seed"))

    def integer(self, low, high):
        return self.data.draw(st.integers(low, high))
