"""The exercises on disk: their folders, their facts (exercise.toml) and where their files are."""
import ast
import re
from dataclasses import dataclass
from pathlib import Path

EXERCISES_DIR = Path(__file__).resolve().parent
SOLUTIONS_DIR = EXERCISES_DIR / "solutions"
FOLDER_NAME = re.compile(r"^(\d\d)_([a-z0-9_]+)$")  # "05_layer_norm": number, then name
TODO_RAISE = re.compile(r"""raise NotImplementedError\(\s*["']TODO""")  # how a student file marks its gaps


class UnknownExercise(LookupError):
    pass


class SolutionMissing(FileNotFoundError):
    pass


class BrokenExercise(ValueError):
    """An exercise folder without its facts, or with facts that cannot be read."""


@dataclass(frozen=True)
class Exercise:
    folder: Path
    number: int
    name: str  # the folder's name without its number: "layer_norm"
    title: str
    topic: str
    minutes: int  # what it takes a student who has read the task, roughly
    file: str  # the student's file, in the folder: "layer_norm.py"
    todos: int  # how many `raise NotImplementedError("TODO ...")` the handed-out file holds
    backward: bool = True  # the code has a backward, so the checks include a gradient check

    @property
    def key(self):
        """The folder's name, "05_layer_norm": what `check` accepts, as do "05", "5" and "layer_norm"."""
        return self.folder.name

    def student_path(self):
        return self.folder / self.file

    def solution_path(self):
        path = SOLUTIONS_DIR / self.key / self.file
        if not path.exists():
            raise SolutionMissing(f"no reference solution for {self.key}: {path} does not exist (a teacher may have removed solutions/)")
        return path

    def checks_path(self):
        return self.folder / f"test_{Path(self.file).stem}.py"

    def todos_left(self, path=None):
        """The TODO raises still in the student's file: as many as handed out means not started."""
        return len(TODO_RAISE.findall((path or self.student_path()).read_text()))

    def not_started(self):
        """True while every TODO raise handed out is still in the student's file."""
        return self.todos > 0 and self.todos_left() >= self.todos


FACTS = ("title", "topic", "minutes", "file", "todos")


def read_facts(path):
    """exercise.toml's lines `key = "text"`, `key = 12` or `key = false` (a subset of TOML that Python
    3.10 reads too), each with an optional `# comment`."""
    if not path.exists():
        raise BrokenExercise(f"{path.parent.name}: no exercise.toml; every exercise folder needs one, with {', '.join(FACTS)}")
    facts = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, equals, value = line.partition("=")
        facts[key.strip()] = None
        for text in (value.strip(), value.split("#")[0].strip()):  # with, then without a trailing comment
            text = {"true": "True", "false": "False"}.get(text, text)
            try:
                facts[key.strip()] = ast.literal_eval(text) if equals else None
                break
            except (ValueError, SyntaxError):
                continue
        if facts[key.strip()] is None:
            raise BrokenExercise(f"{path}:{number}: expected `key = \"text\"` or `key = number`, got {line!r}")
    missing = [key for key in FACTS if key not in facts]
    if missing:
        raise BrokenExercise(f"{path}: missing {', '.join(missing)}")
    return facts


def _read(folder):
    number, name = FOLDER_NAME.match(folder.name).groups()
    facts = read_facts(folder / "exercise.toml")
    return Exercise(
        folder=folder, number=int(number), name=name, title=facts["title"], topic=facts["topic"],
        minutes=int(facts["minutes"]), file=facts["file"], todos=int(facts["todos"]),
        backward=bool(facts.get("backward", True)),
    )  # fmt: skip


def all_exercises():
    """Every exercise, in the order of their numbers."""
    folders = sorted(p for p in EXERCISES_DIR.iterdir() if p.is_dir() and FOLDER_NAME.match(p.name))
    return [_read(folder) for folder in folders]


def find(name):
    """The exercise called `name`: its folder's name ("05_layer_norm"), its number ("05" or "5")
    or its name ("layer_norm", or "layer-norm")."""
    wanted = str(name).strip().replace("-", "_").lower()
    exercises = all_exercises()
    for exercise in exercises:
        if wanted in (exercise.key, exercise.name) or (wanted.isdigit() and int(wanted) == exercise.number):
            return exercise
    names = ", ".join(exercise.key for exercise in exercises)
    raise UnknownExercise(f"no exercise called {name!r}; the exercises are: {names}")
