"""Exercise 20 (LayerNorm's JVP) with a planted mistake: the first failing check names the term."""
from test_exercises import _planted, needs_solutions


@needs_solutions
def test_the_mean_term_forgotten_is_named(tmp_path):
    """dxhat = r (tx − xhat mean(xhat tx)): the headline is the mean term, and the variance term's check passes."""
    marks, headline = _planted(tmp_path, "jvp_rule", "def normalized_tangent", "(tangent - mean_tangent - xhat", "(tangent - xhat")
    assert headline.startswith("the mean term: "), headline
    assert "The − mean(tx) term (moving x moves μ) is missing" in headline, headline
    assert [mark for name, mark in marks.items() if name.startswith("the variance term")] == ["ok  "], marks


@needs_solutions
def test_the_variance_term_forgotten_is_named(tmp_path):
    """dxhat = r (tx − mean(tx)): the headline is the variance term, and the mean term's check passes."""
    marks, headline = _planted(tmp_path, "jvp_rule", "def normalized_tangent", " - xhat * mean_xhat_tangent)", ")")
    assert headline.startswith("the variance term: "), headline
    assert "The − xhat ⊙ mean(xhat ⊙ tx) term (moving x moves σ², so r) is missing" in headline, headline
    assert [mark for name, mark in marks.items() if name.startswith("the mean term")] == ["ok  "], marks


@needs_solutions
def test_the_weight_forgotten_fails_jvpcheck_not_the_terms(tmp_path):
    """dy = dxhat + ... (w left out): both terms hold, and finite differences convict the rule."""
    marks, headline = _planted(tmp_path, "jvp_rule", "def jvp", "xhat, rstd) * weight", "xhat, rstd)")
    assert headline.startswith("jvpcheck: "), headline
    assert "jvpcheck failed for a lambda (ops: LayerNorm)" in headline, headline
    assert {mark for name, mark in marks.items() if name.startswith(("the mean term", "the variance term"))} == {"ok  "}, marks
