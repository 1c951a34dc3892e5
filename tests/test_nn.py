"""Modules: registration and names, saving and loading, modes, errors, and the layers' forward."""
import numpy as np
import pytest

import microtensor as mt
import microtensor.nn as nn
from microtensor.errors import InputError, InputTypeError, MicrotensorError
from microtensor.nn import StateDictError
from microtensor.optim import SGD


class Attention(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)


class Block(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = Attention(n_embd)
        self.drop = nn.Dropout(0.1)


class TinyGPT(nn.Module):
    """The shape of nanoGPT's module tree (no forward needed to test the tree)."""

    def __init__(self, vocab_size=5, n_embd=4, n_layer=2):
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab_size, n_embd),
                "h": nn.ModuleList([Block(n_embd) for _ in range(n_layer)]),
                "ln_f": nn.LayerNorm(n_embd, bias=False),
            }
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = nn.Parameter(np.zeros((n_embd, vocab_size), dtype=np.float32))


class MLP(nn.Module):
    def __init__(self, dtype=np.float32):
        super().__init__()
        self.fc1 = nn.Linear(2, 16, dtype=dtype)
        self.fc2 = nn.Linear(16, 1, dtype=dtype)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


# ================================================================================= the module tree


def test_named_parameters_use_dotted_names_in_assignment_order():
    names = [name for name, _ in TinyGPT().named_parameters()]
    block = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias"]
    assert names == (
        ["transformer.wte.weight"]
        + [f"transformer.h.{i}.{name}" for i in range(2) for name in block]
        + ["transformer.ln_f.weight", "lm_head.weight"]
    )


def test_modules_children_and_parameters():
    model = TinyGPT()
    assert [name for name, _ in model.named_children()] == ["transformer", "lm_head"]
    assert list(model.children()) == [model.transformer, model.lm_head]
    module_names = [name for name, _ in model.named_modules()]
    assert module_names[:4] == ["", "transformer", "transformer.wte", "transformer.h"]
    assert "transformer.h.1.attn.c_proj" in module_names
    assert len(list(model.modules())) == len(module_names)
    assert [p.shape for p in model.parameters()] == [p.shape for _, p in model.named_parameters()]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())
    expected = 5 * 4 + 2 * (4 + 4 + 4 * 12 + 12 + 4 * 4 + 4) + 4 + 4 * 5
    assert model.num_parameters() == expected


def test_tied_weights_are_listed_and_counted_once():
    model = TinyGPT()
    before = model.num_parameters()
    tied = nn.Parameter(np.zeros((5, 4), dtype=np.float32))
    model.transformer.wte.weight = tied
    model.lm_head.weight = tied  # nanoGPT ties the embedding and the output layer
    names = [name for name, _ in model.named_parameters()]
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names
    assert model.num_parameters() == before - 4 * 5
    assert sum(p is tied for p in model.parameters()) == 1


def test_reassigning_a_parameter_keeps_its_place_and_none_unregisters():
    layer = nn.Linear(2, 3)
    layer.weight = nn.Parameter(np.ones((2, 3), dtype=np.float32))
    assert [name for name, _ in layer.named_parameters()] == ["weight", "bias"]
    assert np.array_equal(layer.weight.data, np.ones((2, 3)))
    layer.bias = None
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
    assert layer.bias is None


def test_module_list_and_dict():
    layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 3)])
    layers.append(nn.Linear(3, 1))
    assert len(layers) == 3
    assert layers[-1].out_features == 1 and layers[0] is next(iter(layers))
    assert [m.out_features for m in layers[1:]] == [3, 1]
    assert [name for name, _ in layers.named_parameters()][:3] == ["0.weight", "0.bias", "1.weight"]
    with pytest.raises(IndexError, match="ModuleList: index 3 is out of range"):
        layers[3]
    with pytest.raises(TypeError, match="ModuleList: expected a Module"):
        layers.append(np.zeros(2))

    d = nn.ModuleDict({"wte": nn.Embedding(3, 2)})
    assert d["wte"] is d.wte and "wte" in d and list(d) == ["wte"] and len(d) == 1
    with pytest.raises(KeyError, match="ModuleDict has no key 'wpe'"):
        d["wpe"]
    with pytest.raises(KeyError, match="without '.'"):
        d["a.b"] = nn.Linear(1, 1)


def test_parameter():
    data = np.ones((2, 2), dtype=np.float32)
    p = nn.Parameter(data)
    assert p.requires_grad and p.dtype == np.float32
    data[0, 0] = 5
    assert p.data[0, 0] == 1  # a copy
    assert type(p * 2) is mt.Tensor  # ops give plain Tensors
    assert not nn.Parameter(data, requires_grad=False).requires_grad
    assert "Parameter containing" in repr(p)


def test_repr_shows_the_tree():
    text = repr(TinyGPT())
    assert text.startswith("TinyGPT(\n  (transformer): ModuleDict(\n    (wte): Embedding(5, 4)\n")
    assert "(c_attn): Linear(in_features=4, out_features=12, bias=True)" in text
    assert "(ln_f): LayerNorm(4, eps=1e-05, bias=False)" in text
    assert "(drop): Dropout(p=0.1)" in text


# ================================================================================= errors


def test_unknown_attribute_names_the_class_and_the_attribute():
    model = TinyGPT()
    with pytest.raises(AttributeError, match="TinyGPT has no attribute 'lm_haed'; did you mean 'lm_head'"):
        model.lm_haed
    with pytest.raises(AttributeError, match="Linear has no attribute 'foo'"):
        model.lm_head.foo
    assert not hasattr(model, "wte")  # never None: a missing attribute is an error


def test_assignment_errors():
    class Forgot(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)

    with pytest.raises(AttributeError, match="call super\\(\\).__init__\\(\\) first"):
        Forgot()

    layer = nn.Linear(2, 3)
    with pytest.raises(TypeError, match="Linear.weight is a registered Parameter"):
        layer.weight = mt.ones(2, 3)
    with pytest.raises(TypeError, match="wrap it in nn.Parameter"):
        layer.scale = mt.ones(3, requires_grad=True)
    with pytest.raises(AttributeError, match="the name 'eval' is taken by Linear.eval"):
        layer.eval = nn.Linear(1, 1)
    with pytest.raises(NotImplementedError, match="TinyGPT has no forward"):
        TinyGPT()(1)


# ================================================================================= state dict


def test_state_dict_round_trip_through_npz(tmp_path):
    mt.manual_seed(0)
    model = TinyGPT()
    state = model.state_dict()
    assert list(state) == [name for name, _ in model.named_parameters()]
    assert all(isinstance(v, np.ndarray) for v in state.values())
    state["lm_head.weight"][...] = 7.0
    assert not np.any(model.lm_head.weight.data == 7.0)  # copies

    np.savez(tmp_path / "model.npz", **model.state_dict())
    mt.manual_seed(1)
    other = TinyGPT()
    other.transformer.wte.weight.data[...] = 3.0
    with np.load(tmp_path / "model.npz") as saved:
        result = other.load_state_dict(dict(saved))
    assert result.missing_keys == [] and result.unexpected_keys == []
    for (name, a), (_, b) in zip(model.named_parameters(), other.named_parameters()):
        assert np.array_equal(a.data, b.data), name


def test_load_state_dict_errors_list_every_problem_and_load_nothing():
    model = TinyGPT()
    state = model.state_dict()
    del state["transformer.h.1.attn.c_proj.bias"]
    state["transformer.h.7.ln_1.weight"] = np.zeros(4, dtype=np.float32)
    state["lm_head.weight"] = np.zeros((5, 4), dtype=np.float32)  # transposed
    state["transformer.ln_f.weight"] = np.zeros(4, dtype=np.float64)
    state["transformer.wte.weight"] = state["transformer.wte.weight"] + 1

    before = model.state_dict()
    with pytest.raises(RuntimeError) as error:
        model.load_state_dict(state)
    message = str(error.value)
    assert "missing keys (in the model, not in the state dict): transformer.h.1.attn.c_proj.bias" in message
    assert "unexpected keys (in the state dict, not in the model): transformer.h.7.ln_1.weight" in message
    assert "lm_head.weight: the checkpoint has shape (5, 4) float32, the model has (4, 5) float32" in message
    assert "transformer.ln_f.weight: the checkpoint has shape (4,) float64, the model has (4,) float32" in message
    for name, array in model.state_dict().items():
        assert np.array_equal(array, before[name]), name


def test_load_state_dict_not_strict_reports_and_still_checks_shapes():
    model = nn.Linear(2, 3)
    result = model.load_state_dict({"weight": np.ones((2, 3), dtype=np.float32), "scale": np.ones(1)}, strict=False)
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["scale"]
    assert np.array_equal(model.weight.data, np.ones((2, 3)))
    with pytest.raises(RuntimeError, match="weight: the checkpoint has shape \\(3, 2\\)"):
        model.load_state_dict({"weight": np.ones((3, 2), dtype=np.float32)}, strict=False)


# ================================================================================= modes, grads, dtype


def test_train_and_eval_reach_every_module():
    model = TinyGPT()
    assert all(m.training for m in model.modules())
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    model.transformer.train()
    assert model.transformer.h[1].drop.training and not model.training
    model.train()
    assert all(m.training for m in model.modules())


def test_zero_grad_sets_every_grad_to_none():
    model = MLP()
    loss = model(mt.randn(4, 2)).sum()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_to_changes_the_dtype_and_keeps_the_parameters():
    model = MLP()
    params = list(model.parameters())
    values = [p.data.copy() for p in params]
    assert model.to(np.float64) is model
    assert all(p.dtype == np.float64 for p in model.parameters())
    assert all(a is b for a, b in zip(params, model.parameters()))
    for p, v in zip(params, values):
        assert np.array_equal(p.data, v.astype(np.float64))
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        model.to(np.int64)


# ================================================================================= Linear


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_forward_and_backward_against_numpy(dtype):
    layer = nn.Linear(3, 4, dtype=dtype)
    x = mt.tensor(np.random.default_rng(0).standard_normal((2, 5, 3)).astype(dtype), requires_grad=True)
    y = layer(x)
    assert y.dtype == dtype and y.shape == (2, 5, 4)
    expected = x.data.astype(np.float64) @ layer.weight.data + layer.bias.data
    np.testing.assert_allclose(y.data, expected, rtol=1e-5 if dtype == np.float32 else 1e-12)

    grad = np.random.default_rng(1).standard_normal(y.shape).astype(dtype)
    y.backward(grad)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(layer.weight.grad, np.einsum("bti,bto->io", x.data, grad), rtol=tol, atol=tol)
    np.testing.assert_allclose(layer.bias.grad, grad.sum(axis=(0, 1)), rtol=tol, atol=tol)
    np.testing.assert_allclose(x.grad, grad @ layer.weight.data.T, rtol=tol, atol=tol)


def test_linear_without_bias_and_init():
    mt.manual_seed(3)
    layer = nn.Linear(100, 50, bias=False)
    assert layer.bias is None and [n for n, _ in layer.named_parameters()] == ["weight"]
    assert layer.weight.shape == (100, 50) and layer.weight.dtype == np.float32
    bound = 1 / np.sqrt(100)
    w = layer.weight.data
    assert w.min() >= -bound and w.max() <= bound and w.max() > 0.9 * bound and w.min() < -0.9 * bound
    assert abs(w.std() - bound / np.sqrt(3)) < 0.01 * bound  # the std of uniform(-b, b)
    x = np.ones((1, 100), dtype=np.float32)
    np.testing.assert_allclose(layer(mt.tensor(x)).data, x @ w, rtol=1e-5)


def test_init_is_repeatable_and_the_same_in_both_dtypes():
    mt.manual_seed(7)
    a = TinyGPT()
    mt.manual_seed(7)
    b = TinyGPT()
    mt.manual_seed(7)
    c = nn.Linear(3, 4, dtype=np.float64)
    mt.manual_seed(7)
    d = nn.Linear(3, 4)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert np.array_equal(p.data, q.data), name
    assert np.array_equal(c.weight.data.astype(np.float32), d.weight.data)


# ================================================================================= the other layers


def test_embedding_forward():
    mt.manual_seed(0)
    emb = nn.Embedding(10, 3)
    assert emb.weight.shape == (10, 3) and emb.weight.dtype == np.float32
    ids = mt.tensor(np.array([[1, 2, 2], [9, 0, 1]]))
    out = emb(ids)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.data, emb.weight.data[ids.data])
    big = nn.Embedding(1000, 100).weight.data
    assert abs(big.mean()) < 0.01 and abs(big.std() - 1) < 0.01  # N(0, 1)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_forward(bias):
    ln = nn.LayerNorm(6, eps=1e-5, bias=bias, dtype=np.float64)
    assert np.array_equal(ln.weight.data, np.ones(6)) and (ln.bias is None) == (not bias)
    rng = np.random.default_rng(0)
    ln.weight.data[...] = rng.standard_normal(6)
    if bias:
        ln.bias.data[...] = rng.standard_normal(6)
    x = rng.standard_normal((2, 3, 6))
    out = ln(mt.tensor(x))
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * ln.weight.data
    if bias:
        expected = expected + ln.bias.data
    np.testing.assert_allclose(out.data, expected, rtol=1e-10, atol=1e-12)
    assert nn.LayerNorm(6)(mt.tensor(x.astype(np.float32))).dtype == np.float32


def test_rms_norm_forward():
    norm = nn.RMSNorm(5, eps=1e-6, dtype=np.float64)
    norm.weight.data[...] = np.arange(1.0, 6.0)
    x = np.random.default_rng(0).standard_normal((3, 5))
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * np.arange(1.0, 6.0)
    np.testing.assert_allclose(norm(mt.tensor(x)).data, expected, rtol=1e-10)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


def test_dropout_uses_the_training_flag():
    drop = nn.Dropout(0.5)
    x = mt.ones(200, 50)
    mt.manual_seed(0)
    out = drop(x).data
    assert set(np.unique(out)) == {0.0, 2.0}  # dropped, or kept and scaled by 1/(1-p)
    assert 0.45 < (out == 0).mean() < 0.55
    drop.eval()
    assert np.array_equal(drop(x).data, x.data)
    with pytest.raises(ValueError, match="Dropout: p must be in"):
        nn.Dropout(1.5)


# ================================================================================= training


def test_tiny_mlp_trained_with_sgd_lowers_its_loss():
    mt.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (64, 2)).astype(np.float32)
    y = (x[:, :1] * x[:, 1:]).astype(np.float32)  # a product: needs the hidden layer
    model = MLP()
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(200):
        loss = ((model(mt.tensor(x)) - mt.tensor(y)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]
    assert all(p.dtype == np.float32 for p in model.parameters())


# ================================================================================= checks (issue 12)
# Each of these was accepted before (a float size rounded or crashing in numpy, an eps < 0 giving
# nan, an input of the wrong width failing deep in an op without naming the layer).



@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: nn.Linear(2.5, 3), InputTypeError, "Linear: in_features must be an int, got float 2.5"),
        (lambda: nn.Linear(0, 3), InputError, "Linear: in_features must be >= 1, got 0"),
        (lambda: nn.Linear(2, -1), InputError, "Linear: out_features must be >= 1, got -1"),
        (lambda: nn.Linear(True, 3), InputTypeError, "Linear: in_features must be an int"),
        (lambda: nn.Linear(2, 3, bias="no"), InputTypeError, "Linear: bias must be True or False"),
        (lambda: nn.Linear(2, 3, dtype=np.int32), InputTypeError, "Linear: dtype must be float32 or float64"),
        (lambda: nn.Linear(2, 3, dtype="banana"), InputTypeError, "Linear: dtype must be float32 or float64"),
        (lambda: nn.Embedding(0, 4), InputError, "Embedding: num_embeddings must be >= 1"),
        (lambda: nn.Embedding(5, "4"), InputTypeError, "Embedding: embedding_dim must be an int"),
        (lambda: nn.LayerNorm(0), InputError, "LayerNorm: dim must be >= 1"),
        (lambda: nn.LayerNorm(4, eps=-1e-5), InputError, "LayerNorm: eps must be > 0 and finite"),
        (lambda: nn.LayerNorm(4, eps=float("nan")), InputError, "LayerNorm: eps must be > 0 and finite"),
        (lambda: nn.LayerNorm(4, bias=None), InputTypeError, "LayerNorm: bias must be True or False"),
        (lambda: nn.RMSNorm(4, eps=0.0), InputError, "RMSNorm: eps must be > 0 and finite"),
        (lambda: nn.RMSNorm(4.0), InputTypeError, "RMSNorm: dim must be an int"),
        (lambda: nn.Dropout("0.1"), InputTypeError, "Dropout: p must be a number"),
        (lambda: nn.Dropout(float("nan")), InputError, r"Dropout: p must be in \[0, 1\)"),
    ],
)
def test_layer_constructors_check_their_arguments(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_layer_constructors_take_numpy_integers():
    layer = nn.Linear(np.int64(3), np.int32(2))
    assert layer.weight.shape == (3, 2) and type(layer.in_features) is int


@pytest.mark.parametrize(
    "layer, x, error, message",
    [
        (nn.Linear(3, 4), mt.ones(2, 5), InputError, r"Linear\(in_features=3, out_features=4, bias=True\): expected an input whose last dim is 3, got shape \(2, 5\)"),
        (nn.Linear(3, 4), mt.tensor(np.ones((2, 3))), InputTypeError, r"Linear\(.*\): expected a float32 input \(the layer's dtype\), got float64"),
        (nn.Linear(3, 4), np.ones((2, 3), dtype=np.float32), InputTypeError, r"Linear\(.*\): expected a Tensor input, got ndarray"),
        (nn.Linear(3, 4), mt.tensor(1.0), InputError, r"last dim is 3, got shape \(\)"),
        (nn.LayerNorm(4), mt.ones(2, 3), InputError, r"LayerNorm\(4, eps=1e-05, bias=True\): expected an input whose last dim is 4"),
        (nn.RMSNorm(4), mt.ones(2, 3), InputError, r"RMSNorm\(4, eps=1e-05\): expected an input whose last dim is 4"),
        (nn.Embedding(5, 3), mt.tensor(np.array([1, 5])), InputError, r"Embedding\(5, 3\): id 5 is out of range; ids must be in \[0, 5\)"),
        (nn.Embedding(5, 3), mt.tensor(np.array([-1])), InputError, r"Embedding\(5, 3\): id -1 is out of range"),
        (nn.Embedding(5, 3), mt.tensor(np.array([1.0])), InputTypeError, r"Embedding\(5, 3\): ids must be integers, got float64"),
        (nn.Embedding(5, 3), [1, 2], InputTypeError, r"Embedding\(5, 3\): expected a Tensor of ids, got list"),
        (nn.Dropout(0.1), [1.0], InputTypeError, r"Dropout\(p=0.1\): expected a Tensor input, got list"),
    ],
    ids=lambda x: type(x).__name__,
)
def test_layer_forward_checks_its_input_and_names_the_layer(layer, x, error, message):
    with pytest.raises(error, match=message):
        layer(x)


def test_load_state_dict_errors_are_the_projects_and_still_runtime_errors():
    layer = nn.Linear(2, 3)
    with pytest.raises(StateDictError, match="Linear.load_state_dict: nothing was loaded") as error:
        layer.load_state_dict({"weight": np.ones((3, 2), dtype=np.float32), "bias": np.zeros(3, dtype=np.float32)})
    assert isinstance(error.value, MicrotensorError) and isinstance(error.value, RuntimeError)
    with pytest.raises(InputTypeError, match="Linear.load_state_dict: expected a dict of arrays"):
        layer.load_state_dict([np.ones((2, 3))])
    with pytest.raises(InputTypeError, match="strict must be True or False"):
        layer.load_state_dict(layer.state_dict(), strict="no")


def test_train_mode_must_be_a_bool_and_module_list_indices_ints():
    with pytest.raises(InputTypeError, match="Linear.train: mode must be True or False"):
        nn.Linear(2, 2).train("eval")  # a non-empty string would have meant True
    with pytest.raises(InputTypeError, match="ModuleList: an index must be an int or a slice, got str"):
        nn.ModuleList([nn.Linear(1, 1)])["0"]


def test_layers_too_large_to_allocate_say_so():
    """Linear, Embedding, and a GPT built of them, with a size this computer cannot hold: an
    AllocationError (an InputError and a MemoryError) naming the layer, the shape and the dtype."""
    from gpt.model.transformer import GPT, GPTConfig

    with pytest.raises(mt.AllocationError, match=r"^Linear: cannot allocate a tensor of shape \(1000000, 1000000\) and dtype float32"):
        nn.Linear(10**6, 10**6)
    with pytest.raises(mt.AllocationError, match=r"^Embedding: cannot allocate a tensor of shape \(1000000, 10000000\) and dtype float64"):
        nn.Embedding(10**6, 10**7, dtype=mt.float64)
    with pytest.raises(mt.AllocationError, match=r"^Embedding: cannot allocate a tensor of shape \(1000000000, 64\) and dtype float32") as caught:
        GPT(GPTConfig(vocab_size=10**9, n_embd=64))
    assert isinstance(caught.value, InputError) and isinstance(caught.value, MemoryError)
