"""pytest can run the checks too: `pytest exercises/01_tanh` on the student's file, and with
`--solution` on the reference. `impl` is the module under test."""
from pathlib import Path

import pytest

from exercises import catalog
from exercises.checking import load_exercise


def pytest_addoption(parser):
    parser.addoption("--solution", action="store_true", help="check the reference solutions, not the student's files")


@pytest.fixture
def impl(request):
    folder = Path(request.node.path).resolve().parent
    exercise = catalog.find(folder.name)
    return load_exercise(exercise, "solution" if request.config.getoption("--solution") else "student")
