"""The sinusoidal position table of "Attention Is All You Need": a constant added to the token
embeddings, so nothing here has a backward (the GPT uses it with pos="sinusoidal"; docs/positions.md)."""
import numpy as np


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
