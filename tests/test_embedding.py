"""Embeddings: the NumPy table against nn.Embedding, the init scale, the range checks, weight tying."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from gptbook.scratch.embedding import embed, init_embedding


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
