"""The global random number generator: parameter init, `randn`, dropout masks.

One numpy Generator for the whole package, so `microtensor.manual_seed(seed)` makes a run repeatable.
Ops that draw random numbers also take an explicit `generator=` argument.
"""
import numpy as np

from .checks import check_int

_generator = np.random.default_rng(0)


def manual_seed(seed):
    """Re-seed the global generator with `seed`, an int >= 0; returns it."""
    global _generator
    seed = check_int("manual_seed", "seed", seed, low=0)
    _generator = np.random.default_rng(seed)
    return _generator


def get_generator():
    return _generator


def get_state():
    """The global generator's state as a dict (for checkpoints)."""
    return _generator.bit_generator.state


def set_state(state):
    _generator.bit_generator.state = state
