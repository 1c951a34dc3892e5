"""The errors microtensor raises when a user's input does not fit.

Every error microtensor raises for a user's mistake is a `MicrotensorError`, so one `except
MicrotensorError` catches them all. The kinds below also subclass Python's own exception of the same
meaning (ValueError, TypeError, IndexError, RuntimeError), so code and tests that catch those keep
working. Every message names the function, module or flag, what was given and what was expected.

    InputError        a value, shape, range or option that does not fit      (a ValueError)
    InputTypeError    a wrong type or dtype                                  (a TypeError)
    InputIndexError   an index or a dim outside its range                    (an InputError and an IndexError)
    AllocationError   a size this computer cannot allocate                   (an InputError and a MemoryError)
    GraphError        a graph used in a way it cannot be: a second backward through freed
                      arrays, an array saved for backward changed in place   (a RuntimeError)
    StateDictError    a state dict that does not fit the module or optimizer it is loaded
                      into                                                   (an InputError and a RuntimeError)
    ThreadingError    Numba's threads cannot run in this process (a child made by fork()
                      after GNU OpenMP's threads had started)                (a RuntimeError)

Other modules add their own kinds on the same base (gradcheck's GradcheckError, the checkpoint and
data errors of the programs).
"""


class MicrotensorError(Exception):
    """Base of every error microtensor raises for a user's mistake."""


class InputError(MicrotensorError, ValueError):
    """A value, shape, range or option that does not fit."""


class InputTypeError(MicrotensorError, TypeError):
    """A wrong type or dtype."""


class InputIndexError(InputError, IndexError):
    """An index or a dim outside its range (a value out of range, so an InputError too, like
    numpy's AxisError, which is both a ValueError and an IndexError)."""


class AllocationError(InputError, MemoryError):
    """A size this computer cannot allocate: numpy's MemoryError (or its ValueError for a size
    beyond any address), reported with the op or layer that asked for it. A MemoryError too, so
    that code which catches running out of memory still catches it."""


class GraphError(MicrotensorError, RuntimeError):
    """The graph cannot do what was asked: backward of a tensor that needs no gradient, a second
    backward through arrays the first one freed, or a backward through an array that was changed in
    place after the forward that saved it."""


class ThreadingError(MicrotensorError, RuntimeError):
    """Numba's parallel kernels cannot run in this process: it was made by fork() from a process
    whose kernels had already started GNU OpenMP's threads (see autograd.py)."""


class StateDictError(InputError, RuntimeError):
    """A state dict that does not fit the module or optimizer it is loaded into (names, shapes,
    dtypes, values). An InputError, and a RuntimeError as well, which is what `load_state_dict`
    raised before microtensor had its own errors (and what PyTorch raises)."""
