"""The fuzz files' counts of outcomes, printed once at the end of the run."""
import pytest

from fuzzing import COUNTS


@pytest.fixture(scope="session", autouse=True)
def report_counts(request):
    yield
    total = COUNTS["correct"] + COUNTS["raised"]
    lines = [f"fuzz: {total} calls: {COUNTS['correct']} returned correct results, {COUNTS['raised']} raised MicrotensorError"]
    names = sorted({key[0] for key in COUNTS if isinstance(key, tuple)})
    lines.append("  per entry (correct/raised): " + ", ".join(f"{n} {COUNTS[(n, 'correct')]}/{COUNTS[(n, 'raised')]}" for n in names))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # shown in every run, not only with -rA
            reporter.write_line("")
            for line in lines:
                reporter.write_line(line)
