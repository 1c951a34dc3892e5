"""detect_anomaly(): the first op whose forward or backward makes a NaN or an inf is named, with
the array at fault, its shape, dtype and count of bad elements, and the line that called the op."""
import numpy as np
import pytest

import microtensor as mt
import microtensor.functional as F
from microtensor import autograd

HERE = __file__


def line_of(marker):
    """The line number of this file's line that ends with `# marker`."""
    with open(HERE) as source:
        return next(i for i, line in enumerate(source, 1) if line.rstrip().endswith(f"# {marker}"))


def vector(*values, requires_grad=True):
    return mt.tensor(np.array(values, dtype=np.float32), requires_grad=requires_grad)


def test_a_forward_that_makes_inf_names_the_op_its_output_and_the_callers_line():
    x = vector(1.0, 0.0, 0.0)
    with pytest.raises(mt.AnomalyError) as caught:
        with mt.detect_anomaly():
            y = x * 2.0
            y.log()  # the forward at fault
    message = str(caught.value)
    assert "Log (forward)" in message and "2 inf" in message
    assert "shape (3,)" in message and "float32" in message and "2 of 3 elements" in message
    assert f"{HERE}:{line_of('the forward at fault')}" in message
    assert isinstance(caught.value, mt.MicrotensorError)


def test_a_backward_that_makes_inf_names_the_op_the_input_and_where_the_forward_ran():
    a = vector(4.0, 0.0, 1.0)
    b = vector(1.0, 2.0, 3.0)
    with mt.detect_anomaly():
        root = a.sqrt()  # the op whose backward fails
        loss = (root * b).sum()
        with pytest.raises(mt.AnomalyError) as caught:
            loss.backward()
    message = str(caught.value)
    assert "Sqrt (backward)" in message and "input 0" in message
    assert "1 inf" in message and "1 of 3 elements" in message and "shape (3,)" in message
    assert f"{HERE}:{line_of('the op whose backward fails')}" in message


def test_the_second_input_is_named_when_its_gradient_is_the_bad_one():
    a = vector(1.0, 1.0)
    b = vector(1e-30, 1.0)  # a / b is 1e30, finite in float32; d/db = -a / b² is not
    with mt.detect_anomaly():
        loss = (a / b).sum()
        with pytest.raises(mt.AnomalyError) as caught:
            loss.backward()
    assert "Div (backward)" in str(caught.value) and "input 1 " in str(caught.value)


def test_an_input_already_bad_names_where_it_came_from_not_the_op_that_passes_it_on():
    x = vector(0.0, 1.0)
    bad = x.log()  # made outside anomaly mode: -inf
    with pytest.raises(mt.AnomalyError) as caught:
        with mt.detect_anomaly():
            bad * 3.0
    message = str(caught.value)
    assert "input 0 of Mul" in message and "already holds 1 inf" in message
    assert "the output of Log" in message and "outside detect_anomaly" in message
    data = mt.tensor(np.array([np.nan, 1.0], dtype=np.float32))
    with pytest.raises(mt.AnomalyError, match=r"input 1 of Add .*a leaf"):
        with mt.detect_anomaly():
            x + data


def test_a_bad_gradient_given_to_backward_is_named_as_given():
    x = vector(1.0, 2.0)
    with mt.detect_anomaly():
        y = x * 3.0
        with pytest.raises(mt.AnomalyError, match=r"gradient arriving at the output of Mul .* already holds 1 NaN"):
            y.backward(np.array([np.nan, 1.0], dtype=np.float32))


def test_outside_anomaly_mode_nan_passes_through_and_the_mode_ends_even_after_an_error():
    x = vector(0.0, 1.0)
    with pytest.raises(mt.AnomalyError):
        with mt.detect_anomaly():
            x.log()
    assert autograd._observer is None
    y = x.log()  # no error now
    assert np.isneginf(y.numpy()[0])


def test_an_infinity_asked_for_is_not_an_anomaly():
    x = vector(1.0, 2.0, 3.0)
    mask = mt.tensor(np.array([False, True, False]))
    with mt.detect_anomaly():
        masked = F.masked_fill(x, mask, float("-inf"))  # -inf on purpose
        probs = F.softmax(masked, dim=-1)
        (probs * vector(1.0, 2.0, 3.0, requires_grad=False)).sum().backward()
    assert np.isfinite(x.grad).all()


def test_detect_anomaly_is_also_a_decorator():
    @mt.detect_anomaly()
    def step(t):
        return t.log()

    with pytest.raises(mt.AnomalyError, match="Log"):
        step(vector(0.0))
    assert step.__name__ == "step"
    assert autograd._observer is None


def test_a_training_run_with_detect_anomaly_names_the_op_when_the_loss_diverges(tmp_path, capsys):
    import train

    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    corpus.write_text(" ".join(["the", "king", "and", "queen"][i] for i in rng.integers(0, 4, 2000)) + "\n")
    argv = ["--data", str(corpus), "--out-dir", str(tmp_path / "out"), "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
            "--block-size", "16", "--batch-size", "4", "--eval-iters", "1", "--sample-chars", "0", "--max-iters", "20",
            "--learning-rate", "1e8", "--warmup-iters", "0", "--grad-clip", "0"]  # fmt: skip
    assert train.main([*argv, "--detect-anomaly"]) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert "detect_anomaly:" in said and ("(forward)" in said or "(backward)" in said)
    assert "gpt/model/transformer.py:" in said  # the model's line that called the op
    assert autograd._observer is None
    assert train.main([*argv, "--force"]) == 1  # without the flag: only the loss says so, later
    assert "the loss became nan" in " ".join(capsys.readouterr().out.split())
