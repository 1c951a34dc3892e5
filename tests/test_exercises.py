"""The class exercises: every one is complete, fails on the student's untouched file and passes on
the reference solution (compiled here; as plain Python in CI's NUMBA_DISABLE_JIT=1 run)."""
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exercises import catalog
from exercises.runner import CheckResult, combine, report, run_checks, status_of, verdict
from microtensor.gradcheck import GRADCHECK_CASES

EXERCISES = catalog.all_exercises()
ROOT = Path(__file__).resolve().parent.parent
needs_solutions = pytest.mark.skipif(
    not catalog.SOLUTIONS_DIR.exists(), reason="a handed-out copy: the reference solutions were removed"
)


@pytest.fixture(autouse=True)
def registry_untouched():
    """An exercise's file registers its gradcheck cases; the package's own registry tests must not see them."""
    saved = dict(GRADCHECK_CASES)
    yield
    GRADCHECK_CASES.clear()
    GRADCHECK_CASES.update(saved)


def test_there_are_at_least_fourteen_exercises_numbered_in_order():
    assert len(EXERCISES) >= 14
    assert [e.number for e in EXERCISES] == list(range(1, len(EXERCISES) + 1))


@needs_solutions
@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.key)
def test_an_exercise_has_its_task_hint_checks_and_solution(exercise):
    folder = exercise.folder
    readme = (folder / "README.md").read_text()
    assert readme.startswith(f"# {exercise.number}. "), "the task's title starts with its number"
    assert f"about {exercise.minutes} minutes" in readme, "the task says how long it takes"
    assert f"python -m exercises check {exercise.name}" in readme, "the task says how to check it"
    assert (folder / "HINT.md").read_text().strip()
    assert exercise.checks_path().exists()
    assert exercise.solution_path().exists()
    assert len(exercise.topic) <= 44 and 10 <= exercise.minutes <= 90
    assert exercise.todos >= 1 and exercise.todos_left() == exercise.todos, "the handed-out file keeps all its TODOs"
    assert exercise.todos_left(exercise.solution_path()) == 0, "the solution has no TODO left"
    checks = exercise.checks_path().read_text()
    assert "solutions" not in checks, "the checks never import the solution"
    assert "solutions" not in exercise.student_path().read_text()
    assert len(re.findall(r"^def test_", checks, re.M)) >= 3
    if exercise.backward:
        assert "gradcheck(" in checks, "an exercise with a backward checks it with gradcheck (a random upstream gradient)"
    else:
        assert re.search(r"no backward|nothing is differentiated", readme), "the task says why there is no gradient check"


@needs_solutions
@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.key)
def test_untouched_fails_and_solution_passes(exercise):
    assert status_of(exercise) == "not started"
    student = run_checks(exercise, "student")
    assert not all(r.passed for r in student), f"{exercise.key}: every check passes on the untouched student file"
    assert any(r.todo for r in student), f"{exercise.key}: no check reached a TODO"
    solution = run_checks(exercise, "solution")
    failed = [f"{r.name}: {r.message}" for r in solution if r.failed]
    assert not failed, f"{exercise.key}: the reference solution fails:\n" + "\n".join(failed)


def _exercises(*args, env=None):
    environment = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "exercises", *args], cwd=ROOT, env=environment,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@needs_solutions
def test_list_shows_every_exercise_with_topic_time_and_status():
    result = _exercises("list")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if re.match(r"^\d\d_", line)]
    assert len(rows) == len(EXERCISES)
    for exercise, row in zip(EXERCISES, rows):
        assert row.startswith(exercise.key) and exercise.topic in row and f"{exercise.minutes} min" in row
        assert row.endswith("not started"), row


@needs_solutions
def test_check_gives_a_verdict_and_the_first_failing_check_in_words():
    result = _exercises("check", "tanh", "--python")
    assert result.returncode == 1
    out = result.stdout
    assert "1. The backward of tanh: your file exercises/01_tanh/tanh.py, as plain Python" in out
    assert "Verdict: not started: tanh.py still holds every TODO. Start with TODO: tanh_backward (exercise 1), at line 22." in out
    assert "First failing check: gradcheck: the backward against finite differences" in out
    assert "not written yet: TODO: tanh_backward (exercise 1)" in out
    assert 'tanh.py:22, in tanh_backward: raise NotImplementedError("TODO: tanh_backward (exercise 1)")' in out


@needs_solutions
def test_check_solution_passes_as_python_and_compiled():
    result = _exercises("check", "01", "--solution")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "as plain Python (NUMBA_DISABLE_JIT=1)" in result.stdout and "compiled by Numba" in result.stdout
    assert "Verdict: no check fails in this mode: 4 of 5 pass, 1 skipped here." in result.stdout  # the float32 one
    assert "Verdict: passing, all 5 checks." in result.stdout
    assert "Overall (as plain Python and compiled): passing, 5/5 checks" in result.stdout


@needs_solutions
def test_a_wrong_answer_is_reported_with_gradchecks_report(tmp_path, monkeypatch):
    """A student's plausible mistake (the square forgotten) gives gradcheck's report, not a traceback."""
    exercise = catalog.find("tanh")
    wrong = exercise.solution_path().read_text().replace("(one - y[i] * y[i])", "(one - y[i])")
    assert wrong != exercise.solution_path().read_text()
    (tmp_path / exercise.file).write_text(wrong)
    monkeypatch.setattr(catalog.Exercise, "student_path", lambda self: tmp_path / self.file)
    results = run_checks(exercise, "student")
    failed = [r for r in results if not r.passed]
    assert failed and not any(r.todo for r in failed)
    assert "gradcheck failed for tanh" in failed[0].message and "analytic (backward)" in failed[0].message
    assert status_of(exercise, results) == "failing"


def test_unknown_names_and_removed_solutions_are_clear_errors(tmp_path, monkeypatch):
    result = _exercises("check", "no_such_thing")
    assert result.returncode == 2
    assert "no exercise called 'no_such_thing'; the exercises are: 01_tanh" in result.stderr
    monkeypatch.setattr(catalog, "SOLUTIONS_DIR", tmp_path / "solutions")
    with pytest.raises(catalog.SolutionMissing, match=r"no reference solution for 01_tanh: .* does not exist"):
        catalog.find("1").solution_path()


def test_names_are_found_by_number_name_or_folder():
    assert catalog.find("1") == catalog.find("01") == catalog.find("tanh") == catalog.find("01_tanh")


@needs_solutions
def test_handout_copies_the_project_without_solutions(tmp_path):
    result = _exercises("handout", str(tmp_path / "class"))
    assert result.returncode == 0, result.stderr
    copy = tmp_path / "class"
    assert (copy / "exercises" / "01_tanh" / "tanh.py").exists() and (copy / "microtensor").is_dir()
    assert not (copy / "exercises" / "solutions").exists() and not (copy / ".git").exists()
    checked = subprocess.run(
        [sys.executable, "-m", "exercises", "check", "tanh", "--solution"], cwd=copy,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert checked.returncode == 2 and "no reference solution for 01_tanh" in checked.stderr
    again = _exercises("handout", str(copy))
    assert again.returncode == 2 and "exists already" in again.stderr


def test_the_teachers_page_lists_the_exercises_as_they_are():
    from exercises.__main__ import markdown_table

    page = (ROOT / "docs" / "teaching.md").read_text()
    assert markdown_table() in page, "docs/teaching.md's table: paste `python -m exercises list --markdown` again"


def test_exercise_facts_are_read_and_bad_ones_named(tmp_path):
    facts = tmp_path / "exercise.toml"
    facts.write_text('title = "C# in #2"  # a comment\ntopic = "t"\nminutes = 20  # m\nfile = "a.py"\ntodos = 2\nbackward = false\n')
    assert catalog.read_facts(facts) == dict(title="C# in #2", topic="t", minutes=20, file="a.py", todos=2, backward=False)
    facts.write_text('title = unquoted words\n')
    with pytest.raises(catalog.BrokenExercise, match=r"exercise.toml:1: expected `key = \"text\"` or `key = number`, got 'title = unquoted words'"):
        catalog.read_facts(facts)
    facts.write_text('title = "t"\n')
    with pytest.raises(catalog.BrokenExercise, match="missing topic, minutes, file, todos"):
        catalog.read_facts(facts)
    with pytest.raises(catalog.BrokenExercise, match="no exercise.toml; every exercise folder needs one"):
        catalog.read_facts(tmp_path / "nowhere" / "exercise.toml")


def test_a_check_skipped_in_every_mode_is_not_a_passed_one():
    def run(mode, skipped_too):
        return [CheckResult("a", True, 0.0, mode=mode), CheckResult("b", False, 0.0, "no torch", skipped=skipped_too, mode=mode)]

    one_mode_only = combine([run("as plain Python", True), [CheckResult("a", True, 0.0), CheckResult("b", True, 0.0)]])
    assert verdict(one_mode_only) == ("passing", "2/2 checks")
    assert verdict(combine([run("as plain Python", True), run("compiled", True)])) == ("incomplete", "1/2 checks, 1 skipped")
    assert verdict(combine([run("as plain Python", True)])) == ("incomplete", "1/2 checks, 1 skipped")
    assert verdict(combine([run("as plain Python", False)]))[0] == "failing"


TANH_TODO = re.compile(r"    # TODO: for every i.*\n.*raise NotImplementedError\(\"TODO: tanh_backward \(exercise 1\)\"\)")
COMPILE_ONLY_MISTAKES = {
    # numpy that Numba cannot compile: right as plain Python, a TypingError compiled
    "einsum": '    grad_x[:] = np.einsum("i,i->i", grad_y, 1 - y * y)',
    # the right formula with a bare 1.0: float32 arrays computed in float64, seen only compiled
    "bare_float": "    for i in range(y.shape[0]):\n        grad_x[i] = grad_y[i] * (1.0 - y[i] * y[i])",
}


def _copy_with_tanh(tmp_path, body):
    """A copy of exercises/ (no solutions) whose tanh.py has `body` for its TODO: the real files stay untouched."""
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises", ignore=shutil.ignore_patterns("solutions", "__pycache__"))
    student = tmp_path / "exercises" / "01_tanh" / "tanh.py"
    text, replaced = TANH_TODO.subn(body.replace("\\", "\\\\"), student.read_text())
    assert replaced == 1, "tanh.py's TODO is not where this test expects it"
    student.write_text(text)
    return tmp_path


@pytest.mark.slow  # three programs, each compiling the student's kernel: CI's slow run takes it
@pytest.mark.parametrize("mistake", COMPILE_ONLY_MISTAKES)
def test_a_compile_only_mistake_fails_in_check_all_and_list_as_in_check(tmp_path, mistake):
    """`check --all` and `list` grade in the modes `check NAME` runs: a file it fails is never passing."""
    copy = _copy_with_tanh(tmp_path, COMPILE_ONLY_MISTAKES[mistake])
    environment = dict(os.environ)
    run = lambda *args: subprocess.run(
        [sys.executable, "-m", "exercises", *args], cwd=copy, env=environment,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    checked, everything, listed = run("check", "tanh"), run("check", "--all"), run("list")
    assert checked.returncode == 1 and "Verdict: failing, " in checked.stdout, checked.stdout + checked.stderr
    assert everything.returncode == 1, everything.stdout + everything.stderr
    assert re.search(r"^01_tanh +failing +\d/5 checks +first failing \(compiled\): ", everything.stdout, re.MULTILINE), everything.stdout
    assert re.search(r"^01_tanh .* min  failing$", listed.stdout, re.MULTILINE), listed.stdout + listed.stderr
    out = checked.stdout
    assert "--python" not in out, "a compile-only failure passes as plain Python: no advice to run it there"
    assert "$binop" not in out and "$const" not in out, "Numba's internal names mean nothing to a student"
    if mistake == "einsum":
        assert "Numba could not compile your kernel tanh_backward (TypingError): Use of unsupported NumPy function 'numpy.einsum'" in out
        assert re.search(r'at tanh\.py:\d+: grad_x\[:\] = np\.einsum\("i,i->i", grad_y, 1 - y \* y\)', out)
        assert "write the loop" in out
    else:
        assert re.search(r"tanh_backward computes line \d+ of tanh\.py \(`grad_x\[i\] = grad_y\[i\] \* \(1\.0 - y\[i\] \* y\[i\]\)`\) in float64", out), out


def test_handout_into_a_folder_it_cannot_write_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    from exercises.__main__ import main

    def read_only_disk(source, target, **kwargs):
        Path(target).mkdir()  # the copy had begun
        raise OSError(30, "Read-only file system", str(target))

    monkeypatch.setattr(shutil, "copytree", read_only_disk)
    assert main(["handout", str(tmp_path / "class")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "handout: cannot copy the project to" in err and "Read-only file system" in err, err
    assert not (tmp_path / "class").exists()


def test_the_other_failing_checks_are_whole_words():
    """Each further failing check's first line is printed whole, wrapped between words, never cut."""
    exercise = catalog.find("attention")
    long = "dL/dq of shape (2, 2, 5, 3): 48 of 60 values differ from F.scaled_dot_product_attention's backward; " \
           "the worst at [1, 0, 1, 0]: yours -0.000830938640743951, expected 0.478786288785055"
    results = [CheckResult("first", False, 0.0, "why"), CheckResult("second", False, 0.0, long)]
    out = io.StringIO()
    report(exercise, "solution", results, out=out)
    tail = out.getvalue().split("The other failing checks say:\n")[1]
    assert "..." not in tail and " ".join(tail.split()) == f"- second: {long}", tail
    assert all(len(line) <= 100 for line in tail.splitlines()), tail


@needs_solutions
def test_an_untouched_file_is_not_started_in_check_as_in_list():
    """`check NAME` gives an untouched file the status `list` gives it, and says which TODO to start with."""
    exercise = catalog.find("adamw")
    out = io.StringIO()
    report(exercise, "student", run_checks(exercise, "student"), out=out)
    assert status_of(exercise) == "not started"
    assert "Verdict: not started: adamw.py still holds every TODO. Start with TODO: adamw_update (exercise 9), at line 24." in out.getvalue()
    assert "Verdict: failing" not in out.getvalue()


def _planted(tmp_path, name, after, old, new):
    """`check NAME --python` (kernels as Python: nothing to compile) on a copy of exercises/ whose
    student file is the solution with one mistake planted (`old` written `new`, in the code after
    `after`): ({check's name: "ok", "FAIL", ...}, the first failing check's name and first line)."""
    exercise = catalog.find(name)
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises", ignore=shutil.ignore_patterns("__pycache__"))
    text = exercise.solution_path().read_text()
    cut = text.index(after)
    planted = text[:cut] + text[cut:].replace(old, new)
    assert planted != text, f"{exercise.key}: the mistake's line is not where this test expects it"
    (tmp_path / "exercises" / exercise.key / exercise.file).write_text(planted)
    checked = subprocess.run(
        [sys.executable, "-m", "exercises", "check", name, "--python"], cwd=tmp_path,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    lines = checked.stdout.splitlines()
    assert checked.returncode == 1 and any(line.startswith("First failing check: ") for line in lines), checked.stdout + checked.stderr
    marks = {m[2]: m[1] for m in (re.match(r"^  (ok  |FAIL|TODO|skip) (.*?)  \(\d+\.\d+ s\)", line) for line in lines) if m}
    first = next(n for n, line in enumerate(lines) if line.startswith("First failing check: "))
    return marks, lines[first].removeprefix("First failing check: ") + "\n" + lines[first + 1]


@needs_solutions
def test_an_off_by_one_causal_mask_is_named_first(tmp_path):
    """Exercise 8 with the diagonal key left out of the backward: the headline is the mask, not the 1/√D."""
    marks, headline = _planted(tmp_path, "attention", "def attention_backward", "for j in range(i + 1):", "for j in range(i):")
    assert headline.startswith("the mask: "), headline
    assert "leaves out the diagonal key j = i" in headline, headline
    assert [mark for name, mark in marks.items() if "1/√D" in name] == ["ok  "], "the scale is right, yet its check fails"


@needs_solutions
def test_online_attention_without_the_output_rescale_names_the_accumulator(tmp_path):
    """Exercise 14 with acc never rescaled (L stays right): the headline is the accumulator, and no
    check named after L fails."""
    marks, headline = _planted(tmp_path, "online_attention", "def online_attention_forward", "out[b, h, i, d] *= correction", "pass")
    assert headline.startswith("the output accumulator acc is rescaled"), headline
    assert "while L, so m and ℓ, is right" in headline, headline
    named_after_l = {name: mark for name, mark in marks.items() if re.search(r"\bL\b", name) and "O and L" not in name}
    assert named_after_l and set(named_after_l.values()) == {"ok  "}, named_after_l


@needs_solutions
def test_online_attention_with_l_wrong_names_l(tmp_path):
    """The converse: L written log ℓ (m forgotten) fails the check named after L first, and O's checks pass."""
    marks, headline = _planted(tmp_path, "online_attention", "def online_attention_forward", "running_max + np.log(running_sum)", "np.log(running_sum)")
    assert headline.startswith("the kernel's L = m + log ℓ"), headline
    of_o = {name: mark for name, mark in marks.items() if name.startswith(("causal: O", "non-causal: O", "the output accumulator"))}
    assert len(of_o) == 3 and set(of_o.values()) == {"ok  "}, of_o


@needs_solutions
def test_adamw_with_eps_inside_the_root_is_named_so(tmp_path):
    """Exercise 9 with ε inside the square root: the headline names ε, not only the bias correction."""
    marks, headline = _planted(tmp_path, "adamw", "def adamw_update", "(np.sqrt(v_hat) + eps)", "np.sqrt(v_hat + eps)")
    assert "ε inside the square root" in headline, headline


@needs_solutions
def test_softplus_without_the_upstream_gradient_is_not_blamed_on_overflow(tmp_path):
    """Exercise 10 with grad_out left out of the backward: the headline is gradcheck, not the large-input check."""
    marks, headline = _planted(tmp_path, "softplus", "def softplus_backward", "grad_x[i] = grad_out[i] * sigmoid", "grad_x[i] = sigmoid")
    assert headline.startswith("gradcheck: "), headline
    assert [mark for name, mark in marks.items() if "overflows" in name] == ["ok  "], marks


@needs_solutions
def test_int8_codes_truncated_are_named_so(tmp_path):
    """Exercise 17 with int() for np.rint: the headline names the truncation, not only a code of 126."""
    rounding = "np.rint(np.float64(w[k, m]) / np.float64(s))"
    marks, headline = _planted(tmp_path, "int8_quantization", rounding, rounding, "int(np.float64(w[k, m]) / np.float64(s))")
    assert "truncated towards 0 (int() does that): round to the nearest integer with np.rint" in headline, headline
