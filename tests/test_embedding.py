"""Embeddings: the NumPy table against nn.Embedding, the init scale, the range checks, weight tying."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch import nn

from gptbook.scratch.embedding import embed, init_embedding, param, params_of


@settings(max_examples=30, deadline=None)
@given(
    vocab_size=st.integers(1, 50),
    d_model=st.integers(1, 16),
    B=st.integers(1, 3),
    T=st.integers(0, 7),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_same_rows_as_nn_embedding(vocab_size, d_model, B, T, dtype, seed):
    torch.manual_seed(seed)
    wte = nn.Embedding(vocab_size, d_model, dtype=dtype)
    ids = torch.randint(vocab_size, (B, T))
    out = embed(wte.weight.detach().numpy(), ids.numpy())
    assert out.shape == (B, T, d_model) and out.dtype == wte.weight.detach().numpy().dtype
    np.testing.assert_array_equal(out, wte(ids).detach().numpy())  # a lookup does no arithmetic: exact


def test_init_scale():
    rng = np.random.default_rng(0)
    for d_model in (16, 768):
        table = init_embedding(2000, d_model, rng)
        assert table.shape == (2000, d_model) and table.dtype == np.float32
        assert abs(table.std() * math.sqrt(d_model) - 1) < 0.02
        assert abs(np.linalg.norm(table, axis=1).mean() - 1) < 0.03
        assert abs(table.mean()) < 0.01 / math.sqrt(d_model) * 10
    a, b = init_embedding(5, 4, np.random.default_rng(1)), init_embedding(5, 4, np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)  # the rng decides everything
    assert init_embedding(3, 2, rng, dtype=np.float64).dtype == np.float64


def test_bad_ids():
    table = np.zeros((10, 3))
    with pytest.raises(ValueError, match=r"token id 10.*0\.\.9.*vocab_size=10"):
        embed(table, [[1, 10]])
    with pytest.raises(ValueError, match=r"token id -1"):
        embed(table, np.array([-1, 2]))
    with pytest.raises(TypeError, match="integers"):
        embed(table, [0.0, 1.0])
    assert embed(table, np.zeros((2, 0), dtype=np.int64)).shape == (2, 0, 3)


def test_weight_tying_saves_one_table():
    vocab_size, d_model = 50257, 768
    with torch.device("meta"):
        wte, head = nn.Embedding(vocab_size, d_model), nn.Linear(d_model, vocab_size, bias=False)
    mods = nn.ModuleList([wte, head])
    untied = sum(p.numel() for p in mods.parameters())
    head.weight = wte.weight
    tied = sum(p.numel() for p in mods.parameters())
    assert untied - tied == 38_597_376 == vocab_size * d_model


def test_one_hot_times_table_is_the_lookup():
    "The chapter's small version: e_i W is row i of W, exactly, and nn.Embedding and embed return the same rows."
    torch.manual_seed(0)
    W = torch.randn(65, 4)
    idx = torch.tensor([[32, 53, 1, 40, 43, 6]])
    x = F.one_hot(idx, 65).float() @ W
    wte = nn.Embedding(65, 4)
    wte.weight.data.copy_(W)
    assert torch.equal(x, W[idx]) and torch.equal(x, wte(idx).detach())
    np.testing.assert_array_equal(embed(W.numpy(), idx.numpy()), x.numpy())


def test_param_names_the_missing_key():
    params = {"weight": np.zeros((3, 2))}
    assert param(params, "weight") is params["weight"]
    with pytest.raises(KeyError, match=r"no 'wte.weight' in params \(it has weight\): key the arrays like"):
        param(params, "wte.weight")
    many = {f"h.{i}.w": 0 for i in range(8)}
    with pytest.raises(KeyError, match=r"\.\.\. \(8 in all\)"):
        param(many, "x")
    with pytest.raises(KeyError, match="it has nothing"):
        param({}, "x")


def test_params_of_strips_the_prefix_and_only_it():
    params = {"ln_1.weight": 1, "ln_1.bias": 2, "ln_12.weight": 3, "wte.weight": 4}
    assert params_of(params, "ln_1") == {"weight": 1, "bias": 2}
    assert params_of(params, "ln_2") == {}
