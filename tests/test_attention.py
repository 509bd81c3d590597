"""Attention: manual vs F.scaled_dot_product_attention vs NumPy, the causal mask, multi-head, GQA, KV cache."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from gptbook import attention as A
from gptbook import positions as P
from gptbook.scratch import attention as NA

# float32: sums of d_k products and a softmax of T terms each round at ~1e-7 relative, so 1e-5
# absolute on O(1) outputs leaves two orders of margin; float64 keeps ~1e-15, so 1e-10.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}
DTYPES = st.sampled_from([torch.float32, torch.float64])


def ref_attention(q, k, v, mask=None):
    "Reference written out position by position in float64 NumPy: one query row at a time."
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    out = np.zeros(q.shape[:-1] + v.shape[-1:])
    for idx in np.ndindex(*q.shape[:-2]):
        for i in range(q.shape[-2]):
            s = np.array([q[idx][i] @ k[idx][j] for j in range(k.shape[-2])]) / math.sqrt(q.shape[-1])
            if mask is not None:
                s = np.where(mask[i], s, -np.inf)
            w = np.exp(s - s.max())
            out[idx][i] = (w / w.sum()) @ v[idx]
    return out


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 3),
    H=st.integers(1, 4),
    T=st.integers(1, 9),
    extra=st.integers(0, 4),
    d_k=st.sampled_from([1, 2, 8, 16]),
    d_v=st.sampled_from([1, 4, 8]),
    masked=st.booleans(),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_manual_sdpa_numpy_agree(B, H, T, extra, d_k, d_v, masked, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    T_k = T + extra  # queries are the last T of T_k positions, as with a KV cache
    q = torch.randn(B, H, T, d_k, generator=g, dtype=dtype)
    k = torch.randn(B, H, T_k, d_k, generator=g, dtype=dtype)
    v = torch.randn(B, H, T_k, d_v, generator=g, dtype=dtype)
    mask = A.causal_mask(T, T_k) if masked else None
    manual = A.scaled_dot_product_attention(q, k, v, mask)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scratch = NA.scaled_dot_product_attention(
        q.numpy(), k.numpy(), v.numpy(), NA.causal_mask(T, T_k) if masked else None
    )
    assert manual.dtype == dtype and manual.shape == (B, H, T, d_v)
    torch.testing.assert_close(manual, fused, **TOL[dtype])
    np.testing.assert_allclose(scratch, manual.numpy(), **TOL[dtype])
    np.testing.assert_allclose(
        manual.double().numpy(), ref_attention(q, k, v, None if mask is None else mask.numpy()), **TOL[dtype]
    )


def test_causal_mask_matches_definition():
    for T_q, T_k in [(1, 1), (4, 4), (1, 6), (3, 7)]:
        ref = np.array([[j <= T_k - T_q + i for j in range(T_k)] for i in range(T_q)])
        np.testing.assert_array_equal(A.causal_mask(T_q, T_k).numpy(), ref)
        np.testing.assert_array_equal(NA.causal_mask(T_q, T_k), ref)
    assert A.causal_mask(5).dtype == torch.bool and A.causal_mask(5).shape == (5, 5)


def test_masked_positions_get_zero_weight_and_rows_sum_to_one():
    x = np.random.default_rng(0).standard_normal((6, 6))
    w = NA.softmax(np.where(NA.causal_mask(6), x, -np.inf))
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12)
    assert (w[~NA.causal_mask(6)] == 0).all()
    np.testing.assert_allclose(NA.softmax(np.array([0.0, math.log(3)])), [0.25, 0.75])
    assert np.isfinite(NA.softmax(np.array([1000.0, 0.0]))).all()  # no overflow


def _np_params(mha):
    "The layer's state_dict as NumPy arrays: what the NumPy mirror takes."
    return {k: v.detach().numpy() for k, v in mha.state_dict().items()}


@settings(max_examples=30, deadline=None)
@given(
    B=st.integers(1, 2),
    T=st.integers(1, 8),
    head_dim=st.sampled_from([2, 4, 8]),
    heads=st.sampled_from([(1, 1), (2, 2), (4, 4), (4, 2), (4, 1), (6, 3)]),
    bias=st.booleans(),
    rope=st.booleans(),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_mha_torch_sdpa_manual_numpy_agree(B, T, head_dim, heads, bias, rope, dtype, seed):
    n_heads, n_kv_heads = heads
    torch.manual_seed(seed)
    d_model = n_heads * head_dim
    mha = A.MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias).to(dtype)
    assert mha.c_attn.weight.shape == ((n_heads + 2 * n_kv_heads) * head_dim, d_model)
    x = torch.randn(B, T, d_model, dtype=dtype)
    cs = P.rope_angles(T, head_dim, dtype=dtype) if rope else None
    with torch.no_grad():
        y_sdpa = mha(x, rope=cs)
        mha.use_sdpa = False
        y_manual = mha(x, rope=cs)
    y_np = NA.multi_head_attention(
        _np_params(mha), x.numpy(), n_heads, n_kv_heads, rope=tuple(c.numpy() for c in cs) if rope else None
    )
    assert y_sdpa.shape == (B, T, d_model) and y_sdpa.dtype == dtype
    torch.testing.assert_close(y_sdpa, y_manual, **TOL[dtype])
    np.testing.assert_allclose(y_np, y_manual.numpy(), **TOL[dtype])


def test_fused_projection_equals_separate_heads():
    "Reference: h single-head attentions, each with its own slice of the weights, concatenated, then W_o."
    torch.manual_seed(0)
    d_model, n_heads, T = 12, 3, 5
    d_k = d_model // n_heads
    mha = A.MultiHeadAttention(d_model, n_heads).double()
    x = torch.randn(1, T, d_model, dtype=torch.float64)
    W, b = mha.c_attn.weight, mha.c_attn.bias
    Wq, Wk, Wv = W.split(d_model)
    bq, bk, bv = b.split(d_model)
    heads = []
    for h in range(n_heads):
        s = slice(h * d_k, (h + 1) * d_k)
        q, k, v = x[0] @ Wq[s].T + bq[s], x[0] @ Wk[s].T + bk[s], x[0] @ Wv[s].T + bv[s]
        heads.append(torch.as_tensor(ref_attention(q.detach(), k.detach(), v.detach(), A.causal_mask(T).numpy())))
    ref = torch.cat(heads, dim=-1) @ mha.c_proj.weight.T + mha.c_proj.bias
    with torch.no_grad():
        torch.testing.assert_close(mha(x)[0], ref.detach(), atol=1e-12, rtol=1e-12)


def test_gqa_equals_mha_with_repeated_kv_heads():
    "A GQA layer equals a full MHA layer whose k/v weights repeat each kv head for its group."
    torch.manual_seed(1)
    n_heads, n_kv_heads, hd = 6, 2, 4
    d_model, group = n_heads * hd, n_heads // n_kv_heads
    gqa = A.MultiHeadAttention(d_model, n_heads, n_kv_heads).double()
    full = A.MultiHeadAttention(d_model, n_heads).double()
    W, b = gqa.c_attn.weight.detach(), gqa.c_attn.bias.detach()
    q_w, k_w, v_w = W.split([d_model, n_kv_heads * hd, n_kv_heads * hd])
    q_b, k_b, v_b = b.split([d_model, n_kv_heads * hd, n_kv_heads * hd])

    def rep(t):  # each kv head's rows, repeated for the query heads of its group
        return t.view(n_kv_heads, hd, *t.shape[1:]).repeat_interleave(group, 0).reshape(d_model, *t.shape[1:])

    with torch.no_grad():
        full.c_attn.weight.copy_(torch.cat([q_w, rep(k_w), rep(v_w)]))
        full.c_attn.bias.copy_(torch.cat([q_b, rep(k_b), rep(v_b)]))
        full.c_proj.load_state_dict(gqa.c_proj.state_dict())
        x = torch.randn(2, 7, d_model, dtype=torch.float64)
        torch.testing.assert_close(gqa(x), full(x))
    assert sum(p.numel() for p in gqa.parameters()) < sum(p.numel() for p in full.parameters())


@pytest.mark.parametrize("use_sdpa", [True, False])
def test_no_future_leak(use_sdpa):
    torch.manual_seed(2)
    mha = A.MultiHeadAttention(16, 4, 2, use_sdpa=use_sdpa).eval()
    cos, sin = P.rope_angles(10, 4)
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        y = mha(x, rope=(cos, sin))
        for j in [0, 3, 9]:
            x2 = x.clone()
            x2[:, j] += 5 * torch.randn(2, 16)
            y2 = mha(x2, rope=(cos, sin))
            torch.testing.assert_close(y2[:, :j], y[:, :j], atol=0, rtol=0)  # bit for bit: masked weights are exactly 0
            assert (y2[:, j] - y[:, j]).abs().max() > 1e-3  # and the change does reach position j


@pytest.mark.parametrize("use_sdpa", [True, False])
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_kv_cache_step_by_step_equals_full_forward(use_sdpa, n_kv_heads):
    torch.manual_seed(3)
    n_heads, hd, T = 4, 8, 9
    mha = A.MultiHeadAttention(n_heads * hd, n_heads, n_kv_heads, use_sdpa=use_sdpa).eval()
    cos, sin = P.rope_angles(16, hd)
    x = torch.randn(2, T, n_heads * hd)
    cache = A.KVCache(2, n_kv_heads, 16, hd)
    with torch.no_grad():
        full = mha(x, rope=(cos[:T], sin[:T]))
        chunks = [(0, 4), (4, 5), (5, 9)]  # a prompt of 4, one token, then a chunk of 4
        steps = [mha(x[:, a:b], rope=(cos[a:b], sin[a:b]), cache=cache) for a, b in chunks]
    assert cache.pos == T
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
    k, v = cache.update(torch.zeros(2, n_kv_heads, 1, hd), torch.zeros(2, n_kv_heads, 1, hd))
    assert k.shape == v.shape == (2, n_kv_heads, T + 1, hd) and cache.pos == T + 1
    cache.reset()
    assert cache.pos == 0


def test_a_full_kv_cache_says_so():
    cache = A.KVCache(1, 2, 4, 8)
    cache.update(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match="max_seq_len=4"):
        cache.update(torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 2, 8))


def test_bad_head_counts_name_the_numbers():
    with pytest.raises(ValueError, match="d_model=100.*n_heads=3"):
        A.MultiHeadAttention(100, 3)
    with pytest.raises(ValueError, match="n_heads=6.*n_kv_heads=4"):
        A.MultiHeadAttention(24, 6, 4)
    x = np.zeros((1, 2, 100))
    with pytest.raises(ValueError, match="d_model=100.*n_heads=3"):
        NA.multi_head_attention({"c_attn.weight": np.zeros((300, 100)), "c_proj.weight": np.zeros((100, 100))}, x, 3)
    with pytest.raises(ValueError, match="n_heads=4.*n_kv_heads=3"):
        NA.multi_head_attention({"c_attn.weight": np.zeros((300, 100)), "c_proj.weight": np.zeros((100, 100))}, x, 4, 3)
    with pytest.raises(KeyError, match="no 'c_attn.weight' in params"):
        NA.multi_head_attention({"c_attn.w": np.zeros((300, 100))}, x, 4)
    with pytest.raises(TypeError, match="bool"):
        A.scaled_dot_product_attention(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(2, 2))


def test_bfloat16_close_to_float32():
    torch.manual_seed(4)
    mha = A.MultiHeadAttention(32, 4)
    x = torch.randn(2, 6, 32)
    cs = P.rope_angles(6, 8)
    with torch.no_grad():
        ref = mha(x, rope=cs)
        for use_sdpa in (True, False):
            mha16 = A.MultiHeadAttention(32, 4, use_sdpa=use_sdpa).to(torch.bfloat16)
            mha16.load_state_dict(mha.state_dict())
            y = mha16(x.bfloat16(), rope=cs)
            assert y.dtype == torch.bfloat16
            torch.testing.assert_close(y.float(), ref, atol=3e-2, rtol=3e-2)  # bf16 keeps 8 bits of mantissa


def test_dropout_only_in_training():
    torch.manual_seed(5)
    mha = A.MultiHeadAttention(16, 2, dropout=0.5)
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        mha.train()
        a, b = mha(x), mha(x)
        mha.eval()
        c, d = mha(x), mha(x)
    assert not torch.equal(a, b)
    torch.testing.assert_close(c, d, atol=0, rtol=0)
    assert mha.dropout_p == 0.5 and not hasattr(mha, "attn_dropout")  # a float for SDPA, not an unused module
