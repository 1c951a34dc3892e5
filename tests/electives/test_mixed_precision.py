"""16-bit training (microtensor/ops/electives/mixed_precision.py, train.py --dtype): bfloat16's bit
patterns written in numpy, rounding to float16's grid inside autocast, dynamic loss scaling (an
overflow skips the step and halves the scale; clean steps double it), a small GPT's gradients
under float16 and bfloat16 against float32's, the bytes saved for backward halved, bad input, and
a float16 run that resumes exactly, its loss scaler included."""
import numpy as np
import pytest

import microtensor as mt
from microtensor import optim
from microtensor.errors import GraphError, InputError, InputTypeError
from microtensor.ops.electives import mixed_precision as mp
from gpt.model.transformer import GPT, GPTConfig
from programs.cli import FlagError
from test_programs import TINY, corpus, parameters, run_train, said  # noqa: F401 (corpus is a fixture)


def bits_of(value):
    return int(np.float32(value).view(np.uint32))


def float_of(bits):
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


# ------------------------------------------------------------------------------ the formats


@pytest.mark.parametrize(
    "value_bits, expected",
    [
        (bits_of(1.0), 0x3F80),
        (bits_of(-2.0), 0xC000),
        (bits_of(0.0), 0x0000),
        (bits_of(-0.0), 0x8000),
        (0x3F808000, 0x3F80),  # exactly half way between 0x3F80 and 0x3F81: to the even one, down
        (0x3F818000, 0x3F82),  # half way between 0x3F81 and 0x3F82: to the even one, up
        (0x3F808001, 0x3F81),  # just above half way: up
        (0x3F807FFF, 0x3F80),  # just below: down
        (bits_of(np.inf), 0x7F80),
        (bits_of(-np.inf), 0xFF80),
        (0x7F7FFFFF, 0x7F80),  # float32's largest rounds past bfloat16's largest (0x7F7F): inf
        (0x7F7F0000, 0x7F7F),  # bfloat16's largest stays
        (0x00010000, 0x0001),  # a subnormal that fits stays
    ],
)
def test_bfloat16_is_the_upper_half_of_a_float32_rounded_to_nearest_even(value_bits, expected):
    value = float_of(value_bits)
    got = int(mp.to_bfloat16(np.array([value], dtype=np.float32))[0])
    assert got == expected, f"{value_bits:#010x} -> {got:#06x}, expected {expected:#06x}"
    if np.isfinite(value) and expected != 0x7F80:
        assert mp.from_bfloat16(np.array([expected], dtype=np.uint16))[0] == float_of(expected << 16)


def test_bfloat16_keeps_nan_a_nan_even_when_its_set_bits_are_in_the_lower_half():
    nans = np.array([0x7FC00000, 0x7F800001, 0xFF800001], dtype=np.uint32).view(np.float32)
    packed = mp.to_bfloat16(nans)
    assert np.isnan(mp.from_bfloat16(packed)).all()
    assert packed[2] & 0x8000  # the sign stays


def test_rounding_to_the_float16_grid():
    x = np.array([1 + 2.0**-12, 1 + 3 * 2.0**-12, 65504, 70000, 1e-8, 3e-8, 1e-4], dtype=np.float32)
    got = mp.round_to("float16", x)
    assert got.dtype == np.float32
    assert got[0] == 1.0  # a tie: to even (float16's spacing at 1 is 2^-10)
    assert got[1] == 1 + 2.0**-10  # a tie: to even, up
    assert got[2] == 65504 and np.isinf(got[3])  # float16's largest, and past it
    assert got[4] == 0 and got[5] == 2.0**-24  # below half the smallest subnormal: 0
    assert got[6] != np.float32(1e-4) and abs(got[6] - 1e-4) < 1e-4 * 2.0**-10


def test_inside_autocast_op_outputs_and_weights_are_on_the_grid_and_the_masters_come_back():
    rng = np.random.default_rng(0)
    w = mt.tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    x = mt.tensor(rng.standard_normal((2, 4)).astype(np.float32))
    master = w.data.copy()
    for dtype in ("float16", "bfloat16"):
        with mt.autocast(dtype, [w]):
            assert np.array_equal(w.data, mp.round_to(dtype, master))  # the working copy
            y = x @ w
            assert np.array_equal(y.data, mp.round_to(dtype, y.data))
            assert np.array_equal(x.data, x.data)  # an input is never changed
        assert np.array_equal(w.data, master)  # the master weights, exactly
    x64 = mt.tensor(rng.standard_normal((2, 4)))
    with mt.autocast("float16"):
        y64 = x64 * 1.0001
    assert np.array_equal(y64.data, x64.data * 1.0001)  # float64 is not rounded


# ------------------------------------------------------------------------------ loss scaling


def test_float16_loses_small_gradients_that_loss_scaling_keeps():
    w = mt.tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    with mt.autocast("float16", [w]):
        (w * 1e-8).sum().backward()
    assert (w.grad == 0).all()  # 1e-8 is below float16's smallest subnormal, 6e-8
    w.grad = None
    scaler = mt.LossScaler(init_scale=2.0**15)
    with mt.autocast("float16", [w]):
        scaler.scale((w * 1e-8).sum()).backward()
    scaler.unscale([w])
    np.testing.assert_allclose(w.grad, 1e-8, rtol=2.0**-10)


def test_an_overflow_skips_the_step_halves_the_scale_and_clean_steps_double_it():
    w = mt.tensor(np.full(3, 0.5, dtype=np.float32), requires_grad=True)
    optimizer = optim.SGD([w], lr=0.1)
    scaler = mt.LossScaler(init_scale=2.0**15, growth_interval=3)

    def step(factor):
        with mt.autocast("float16", [w]):
            scaler.scale((w * factor).sum()).backward()
        scaler.unscale([w])
        stepped = scaler.step(optimizer)
        scaler.update()
        w.grad = None
        return stepped

    before = w.data.copy()
    assert not step(100.0)  # 100 * 2^15 > 65504: inf in float16
    assert np.array_equal(w.data, before)  # the weights did not move
    assert scaler.scale_value == 2.0**14 and scaler.skipped_steps == 1
    assert step(1.0) and step(1.0)
    assert scaler.scale_value == 2.0**14 and not np.array_equal(w.data, before)
    assert step(1.0)  # the third clean step in a row
    assert scaler.scale_value == 2.0**15 and scaler.clean_steps == 0
    np.testing.assert_allclose(w.data, before - 0.3, rtol=1e-6)  # three steps of lr 0.1 times gradient 1


# ------------------------------------------------------------------------------ a small GPT


def gpt_gradients(dtype):
    config = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    mt.manual_seed(0)
    model = GPT(config)
    rng = np.random.default_rng(0)
    idx, targets = (mt.tensor(rng.integers(0, 65, (4, 32))) for _ in range(2))
    saved = None
    if dtype == "float32":
        _, loss = model(idx, targets)
        saved = mp.saved_bytes(loss)
        loss.backward()
    else:
        with mt.autocast(dtype, model.parameters()):
            _, loss = model(idx, targets)
            saved = mp.saved_bytes(loss)
            loss.backward()
    return np.concatenate([p.grad.ravel() for p in model.parameters()]), saved


# relative L2 error of all gradients together: float16 keeps 11 bits (2^-11 = 5e-4), bfloat16 8 (4e-3)
TOLERANCE = {"float16": 5e-3, "bfloat16": 3e-2}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_gpts_gradients_under_16_bits_are_close_to_float32s_and_backward_keeps_half_the_bytes(dtype, kernel_set):
    exact, saved_float32 = gpt_gradients("float32")
    got, saved = gpt_gradients(dtype)
    error = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert 0 < error < TOLERANCE[dtype]
    assert saved <= 0.55 * saved_float32


# ------------------------------------------------------------------------------ bad input


def test_bad_input_is_a_clear_error():
    with pytest.raises(InputError, match="autocast: dtype 'float8'"):
        mt.autocast("float8")
    with pytest.raises(InputTypeError, match="parameters"):
        mt.autocast("float16", [np.ones(3)])
    with mt.autocast("float16"):
        with pytest.raises(GraphError, match="do not nest"):
            with mt.autocast("bfloat16"):
                pass
    with pytest.raises(InputError, match="init_scale"):
        mt.LossScaler(init_scale=0)
    with pytest.raises(InputError, match="growth_interval"):
        mt.LossScaler(growth_interval=0)


def test_train_refuses_a_dtype_it_cannot_train_in(tmp_path, corpus, capsys):
    assert run_train(tmp_path, corpus, "--dtype", "float8") == 1
    assert "--dtype: given float8, expected float32, float16 or bfloat16" in said(capsys)
    assert run_train(tmp_path, corpus, "--loss-scale-interval", "5") == 1
    assert "--loss-scale-interval" in said(capsys)


# ------------------------------------------------------------------------------ train.py


def test_a_float16_run_resumes_exactly_with_its_loss_scaler(tmp_path, corpus, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    flags = ("--dtype", "float16", "--loss-scale-interval", "3", "--eval-interval", "4", "--sample-chars", "0")
    assert run_train(one, corpus, "--max-iters", "10", *flags) == 0
    assert run_train(two, corpus, "--max-iters", "6", *flags) == 0
    assert run_train(two, corpus, "--max-iters", "10", "--dtype", "float16", "--eval-interval", "4", "--sample-chars", "0", "--resume") == 0  # its interval, 3, kept
    state_one, meta_one = parameters(one)
    state_two, meta_two = parameters(two)
    assert meta_one["loss_scaler"] == meta_two["loss_scaler"]
    assert meta_one["loss_scaler"]["skipped_steps"] >= 1  # the scale grew into an overflow, at least once
    for name in state_one:
        np.testing.assert_array_equal(state_one[name], state_two[name], err_msg=name)
    capsys.readouterr()
    assert run_train(two, corpus, "--max-iters", "12", "--dtype", "bfloat16", "--resume") == 1
    assert "--dtype: given bfloat16 with --resume, expected the checkpoint's dtype float16" in said(capsys)
    assert run_train(two, corpus, "--max-iters", "12", "--dtype", "float16", "--loss-scale-interval", "5", "--resume") == 1
    assert "--loss-scale-interval: given 5 with --resume, expected the checkpoint's 3" in said(capsys)
