"""Every function of microtensor.functional has a fuzz entry in one of the files here."""
import importlib
from pathlib import Path

import microtensor.functional as F
from fuzzing import ENTRIES


def test_every_public_function_is_fuzzed():
    """Every function microtensor.functional exports has an entry here (by name, or under one that
    covers it: concat also calls cat, reshape flatten's view, ...)."""
    for path in sorted(Path(__file__).parent.glob("test_fuzz_*.py")):
        importlib.import_module(path.stem)  # each file registers its entries when imported
    covered = set(ENTRIES) | {"cat", "transpose"}
    public = {name for name in dir(F) if not name.startswith("_") and callable(getattr(F, name))}
    missing = sorted(public - covered)
    assert not missing, f"functional API without a fuzz entry: {missing}"
