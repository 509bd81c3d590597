"""Positions: permutation equivariance, learned table, sinusoids, RoPE (relative property, norms, pairings)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from gptbook import attention as A
from gptbook import positions as P
from gptbook.options import choices_of
from gptbook.scratch import positions as NP


def rotation_reference(x, p, base=10000.0):
    "RoPE by building the block-diagonal rotation matrix of position p, pair by pair (float64)."
    d = x.shape[-1]
    R = np.zeros((d, d))
    for k in range(d // 2):
        a = p * base ** (-2 * k / d)
        R[2 * k : 2 * k + 2, 2 * k : 2 * k + 2] = [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]
    return R @ x


def test_attention_without_positions_is_permutation_equivariant():
    torch.manual_seed(0)
    x = torch.randn(7, 16, dtype=torch.float64)
    Wq, Wk, Wv = (torch.randn(16, 16, dtype=torch.float64) for _ in range(3))

    def attend(x):
        return A.scaled_dot_product_attention(x @ Wq, x @ Wk, x @ Wv)

    perm = torch.randperm(7)
    torch.testing.assert_close(attend(x[perm]), attend(x)[perm])
    # With RoPE the same shuffle no longer just shuffles the output: order now matters.
    cos, sin = P.rope_angles(7, 16, dtype=torch.float64)

    def roped(x):
        return A.scaled_dot_product_attention(P.apply_rope(x @ Wq, cos, sin), P.apply_rope(x @ Wk, cos, sin), x @ Wv)

    assert (roped(x[perm]) - roped(x)[perm]).abs().max() > 1e-3


def test_learned_positions():
    torch.manual_seed(0)
    pos = P.LearnedPositions(8, 4)
    assert pos.weight.shape == (8, 4) and pos.weight.requires_grad
    torch.testing.assert_close(pos.table(3, start=5), pos.weight[5:8])
    x = torch.randn(2, 3, 4)
    y, rope = pos(x, start=5)
    torch.testing.assert_close(y, x + pos.weight[5:8])
    assert rope is None
    with pytest.raises(ValueError, match=r"positions 0\.\.8 exceed max_seq_len=8"):
        pos.table(9)
    with pytest.raises(ValueError, match="positions 7..8 exceed max_seq_len=8"):
        pos(torch.zeros(1, 2, 4), start=7)
    table = np.arange(32.0).reshape(8, 4)
    np.testing.assert_array_equal(NP.learned_positions(table, 2, start=1), table[1:3])
    with pytest.raises(ValueError, match=r"positions 0\.\.8 exceed max_seq_len=8"):
        NP.learned_positions(table, 9)


def test_sinusoidal_table_matches_formula():
    T, d = 12, 10
    ref = np.array(
        [
            [math.sin(p / 10000 ** (i / d)) if i % 2 == 0 else math.cos(p / 10000 ** ((i - 1) / d)) for i in range(d)]
            for p in range(T)
        ]
    )
    t = P.sinusoidal_table(T, d)
    assert t.dtype == torch.float32 and t.shape == (T, d)
    np.testing.assert_allclose(t.numpy(), ref, atol=1e-6)
    np.testing.assert_allclose(NP.sinusoidal_table(T, d), ref, atol=1e-6)
    with pytest.raises(ValueError, match="d_model=7"):
        P.sinusoidal_table(4, 7)


def test_rope_angles_match_formula_and_reject_odd_head_dim():
    cos, sin = P.rope_angles(6, 8, base=100.0)
    assert cos.shape == sin.shape == (6, 4) and cos.dtype == torch.float32
    ang = np.array([[p * 100.0 ** (-2 * k / 8) for k in range(4)] for p in range(6)])
    np.testing.assert_allclose(cos.numpy(), np.cos(ang), atol=1e-7)
    np.testing.assert_allclose(sin.numpy(), np.sin(ang), atol=1e-7)
    nc, ns = NP.rope_angles(6, 8, base=100.0)
    np.testing.assert_allclose(nc, np.cos(ang), atol=1e-7)
    for f in (P.rope_angles, NP.rope_angles, P.rope_halves_to_interleaved, NP.rope_halves_to_interleaved):
        with pytest.raises(ValueError, match="head_dim=7"):
            f(4, 7) if f in (P.rope_angles, NP.rope_angles) else f(7)


def test_apply_rope_matches_rotation_matrices():
    rng = np.random.default_rng(0)
    T, d = 5, 8
    x = rng.standard_normal((2, T, d))
    ref = np.stack([np.stack([rotation_reference(x[b, p], p) for p in range(T)]) for b in range(2)])
    cos, sin = P.rope_angles(T, d, dtype=torch.float64)
    np.testing.assert_allclose(P.apply_rope(torch.from_numpy(x), cos, sin).numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(NP.apply_rope(x, *NP.rope_angles(T, d, dtype=np.float64)), ref, atol=1e-12)


def test_apply_rope_shape_errors():
    cos, sin = P.rope_angles(4, 8)
    with pytest.raises(ValueError, match=r"must be \(5, 4\)"):
        P.apply_rope(torch.zeros(5, 8), cos, sin)
    with pytest.raises(ValueError, match=r"must be \(4, 3\)"):
        NP.apply_rope(np.zeros((4, 6)), cos.numpy(), sin.numpy())


@settings(max_examples=40, deadline=None)
@given(
    i=st.integers(0, 200),
    j=st.integers(0, 200),
    shift=st.integers(-200, 2000),
    d=st.sampled_from([2, 8, 64, 128]),
    seed=st.integers(0, 2**16),
)
def test_rope_scores_depend_only_on_relative_position(i, j, shift, d, seed):
    i2, j2 = i + shift, j + shift
    if min(i2, j2) < 0:
        i2, j2 = i2 - min(i2, j2), j2 - min(i2, j2)
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    cos, sin = NP.rope_angles(max(i, j, i2, j2) + 1, d, dtype=np.float64)

    def rot(x, p):  # x rotated to position p
        return NP.apply_rope(x[None], cos[p : p + 1], sin[p : p + 1])[0]

    s1, s2 = rot(q, i) @ rot(k, j), rot(q, i2) @ rot(k, j2)
    assert abs(s1 - s2) <= 1e-9 * (1 + abs(s1))
    # torch, batched: every score of a T x T matrix against the same matrix shifted by `shift`
    T = 6
    qt, kt = torch.randn(T, d, dtype=torch.float64), torch.randn(T, d, dtype=torch.float64)
    c, s = P.rope_angles(T + abs(shift), d, dtype=torch.float64)
    o = abs(shift)
    scores0 = P.apply_rope(qt, c[:T], s[:T]) @ P.apply_rope(kt, c[:T], s[:T]).T
    scores1 = P.apply_rope(qt, c[o : o + T], s[o : o + T]) @ P.apply_rope(kt, c[o : o + T], s[o : o + T]).T
    torch.testing.assert_close(scores0, scores1, atol=1e-9, rtol=1e-9)


@settings(max_examples=30, deadline=None)
@given(
    shape=st.sampled_from([(3, 8), (2, 4, 5, 16), (1, 7, 2)]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_rope_preserves_norms_dtype_and_shape(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=dtype)
    cos, sin = P.rope_angles(shape[-2], shape[-1], dtype=dtype)
    y = P.apply_rope(x, cos, sin)
    assert y.shape == x.shape and y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=tol, rtol=tol)
    np.testing.assert_allclose(NP.apply_rope(x.numpy(), cos.numpy(), sin.numpy()), y.numpy(), atol=tol, rtol=tol)
    np.testing.assert_allclose(
        np.linalg.norm(NP.apply_rope(x.numpy(), cos.numpy(), sin.numpy()), axis=-1),
        x.norm(dim=-1).numpy(),
        atol=tol,
        rtol=tol,
    )


def test_rope_bfloat16_keeps_dtype():
    x = torch.randn(2, 5, 8)
    cos, sin = P.rope_angles(5, 8)
    y = P.apply_rope(x.bfloat16(), cos, sin)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), P.apply_rope(x, cos, sin), atol=3e-2, rtol=3e-2)


def hf_style_rope(x, cos, sin):
    "Split-halves RoPE written as Hugging Face Llama does: rotate_half, with cos/sin repeated over both halves."
    half = x.shape[-1] // 2
    rotate_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * torch.cat([cos, cos], -1) + rotate_half * torch.cat([sin, sin], -1)


def test_pairing_permutation_maps_llama_weights():
    "Rows of one head of a split-halves q_proj/k_proj, permuted, give the same scores with interleaved RoPE."
    torch.manual_seed(0)
    hd, d_model, T = 8, 16, 6
    perm = P.rope_halves_to_interleaved(hd)
    assert perm.tolist() == [0, 4, 1, 5, 2, 6, 3, 7] and sorted(perm.tolist()) == list(range(hd))
    np.testing.assert_array_equal(NP.rope_halves_to_interleaved(hd), perm.numpy())
    Wq, Wk = torch.randn(hd, d_model, dtype=torch.float64), torch.randn(hd, d_model, dtype=torch.float64)
    x = torch.randn(T, d_model, dtype=torch.float64)
    cos, sin = P.rope_angles(T, hd, dtype=torch.float64)
    hf = hf_style_rope(x @ Wq.T, cos, sin) @ hf_style_rope(x @ Wk.T, cos, sin).T
    ours = P.apply_rope(x @ Wq[perm].T, cos, sin) @ P.apply_rope(x @ Wk[perm].T, cos, sin).T
    torch.testing.assert_close(ours, hf)
    torch.testing.assert_close(P.apply_rope_halves(x @ Wq.T, cos, sin), hf_style_rope(x @ Wq.T, cos, sin))
    np.testing.assert_allclose(
        NP.apply_rope_halves((x @ Wq.T).numpy(), cos.numpy(), sin.numpy()),
        hf_style_rope(x @ Wq.T, cos, sin).numpy(),
        atol=1e-12,
    )
    # without the permutation the scores differ: the pairing is not a detail
    wrong = P.apply_rope(x @ Wq.T, cos, sin) @ P.apply_rope(x @ Wk.T, cos, sin).T
    assert (wrong - hf).abs().max() > 1e-3


def test_pairing_matches_transformers_llama():
    "The outside reference: transformers' own apply_rotary_pos_emb on split-halves q and k."
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    torch.manual_seed(1)
    B, H, T, hd = 1, 2, 5, 8
    q, k = torch.randn(B, H, T, hd), torch.randn(B, H, T, hd)
    cos, sin = P.rope_angles(T, hd)
    q_hf, k_hf = llama.apply_rotary_pos_emb(q, k, torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])
    perm = P.rope_halves_to_interleaved(hd)
    torch.testing.assert_close(P.apply_rope(q[..., perm], cos, sin), q_hf[..., perm], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(
        P.apply_rope(k[..., perm], cos, sin) @ P.apply_rope(q[..., perm], cos, sin).transpose(-2, -1),
        k_hf @ q_hf.transpose(-2, -1),
        atol=1e-5,
        rtol=1e-5,
    )


def test_negative_length_is_refused():
    with pytest.raises(ValueError, match=r"positions 0\.\.-2 exceed"):
        P.LearnedPositions(8, 4).table(-1)
    with pytest.raises(ValueError, match=r"positions 0\.\.-2 exceed"):
        NP.learned_positions(np.zeros((8, 4)), -1)


def _config(positions, **kw):
    "A stand-in for GPTConfig with the fields make_positions reads."
    return SimpleNamespace(positions=positions, **{**dict(max_seq_len=16, d_model=8, n_heads=2, rope_base=500.0), **kw})


@pytest.mark.parametrize("positions", choices_of(P.PositionKind))
def test_position_modules_share_one_interface_and_match_numpy(positions):
    torch.manual_seed(0)
    module = P.make_positions(_config(positions)).double()
    params = {k: v.numpy() for k, v in module.state_dict().items()}
    assert list(params) == (["weight"] if positions == "learned" else [])  # fixed tables are not saved
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        y, rope = module(x, start=4)
    y_np, rope_np = NP.make_positions(params, _config(positions))(x.numpy(), start=4)
    np.testing.assert_allclose(y_np, y.numpy(), rtol=0, atol=1e-12)
    if positions == "rope":
        cos, sin = P.rope_angles(9, 4, base=500.0, dtype=torch.float64)
        torch.testing.assert_close(rope, (cos[4:], sin[4:]), rtol=0, atol=1e-7)  # float32 tables, as buffers
        np.testing.assert_allclose(rope_np[0], rope[0].numpy(), rtol=0, atol=0)
        torch.testing.assert_close(y, x, rtol=0, atol=0)  # RoPE adds nothing to the input
    else:
        assert rope is None and rope_np is None


@pytest.mark.parametrize("positions", ["sinusoidal", "rope"])
def test_fixed_tables_extend_past_max_seq_len(positions):
    short, long = P.make_positions(_config(positions)), P.make_positions(_config(positions, max_seq_len=40))
    x = torch.randn(1, 10, 8)
    for a, b in zip(short(x, start=25), long(x, start=25)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_make_positions_refuses_unknown_kinds():
    with pytest.raises(ValueError, match="positions='alibi' is not one of"):
        P.make_positions(_config("alibi"))
    with pytest.raises(ValueError, match="positions='alibi' is not one of"):
        NP.make_positions({}, _config("alibi"))
    with pytest.raises(KeyError, match="no 'weight' in params"):
        NP.make_positions({"wpe.weight": np.zeros((16, 8))}, _config("learned"))(np.zeros((1, 2, 8)))


def test_rope_angles_match_transformers_llama_rotary_embedding():
    "The angle tables against transformers' own LlamaRotaryEmbedding (each angle repeated over both halves)."
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    hd, T = 16, 40
    config = LlamaConfig(hidden_size=2 * hd, num_attention_heads=2, head_dim=hd, max_position_embeddings=T)
    try:
        rotary = llama.LlamaRotaryEmbedding(config)
    except TypeError:  # transformers before 4.45: LlamaRotaryEmbedding(dim, max_position_embeddings, base)
        rotary = llama.LlamaRotaryEmbedding(hd, T, 10000.0)
    cos_hf, sin_hf = rotary(torch.zeros(1, T, hd), torch.arange(T)[None])
    cos, sin = P.rope_angles(T, hd)
    torch.testing.assert_close(cos_hf[0], torch.cat([cos, cos], -1), atol=1e-5, rtol=0)
    torch.testing.assert_close(sin_hf[0], torch.cat([sin, sin], -1), atol=1e-5, rtol=0)


def _diagonal_spread(S):
    return max((S.diagonal(o).max() - S.diagonal(o).min()).item() for o in range(1 - len(S), len(S)))


def test_rope_score_matrix_is_toeplitz_and_added_positions_are_not():
    "Fixed q and k at every position: RoPE's scores depend on i - j only; an added position table's do not."
    torch.manual_seed(0)
    T, hd = 24, 32
    q, k = torch.randn(hd, dtype=torch.float64), torch.randn(hd, dtype=torch.float64)
    cos, sin = P.rope_angles(T, hd, dtype=torch.float64)
    rope = P.apply_rope(q.expand(T, -1), cos, sin) @ P.apply_rope(k.expand(T, -1), cos, sin).T
    assert _diagonal_spread(rope) < 1e-10
    assert rope.std() > 1  # not constant: the scores do change with the distance
    table = torch.randn(T, hd, dtype=torch.float64)
    assert _diagonal_spread((q + table) @ (k + table).T) > 1
    pe = P.sinusoidal_table(T, hd).double()
    assert _diagonal_spread((q + pe) @ (k + pe).T) > 1
    assert _diagonal_spread(pe @ pe.T) < 1e-5  # the table alone is Toeplitz: the content terms break it


def test_rope_mean_score_of_same_content_decays_with_distance():
    "E[(R_0 q) . (R_s q)] = sum_k 2 cos(s theta_k): head_dim at 0, and far lower at long distance."
    torch.manual_seed(0)
    hd, n = 64, 4000
    qs = torch.randn(n, 1, hd, dtype=torch.float64)
    cos, sin = P.rope_angles(1001, hd, dtype=torch.float64)
    theta = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    for s in [0, 10, 1000]:
        measured = (qs * P.apply_rope(qs, cos[s : s + 1], sin[s : s + 1])).sum(-1).mean().item()
        expected = 2 * torch.cos(s * theta).sum().item()
        assert abs(measured - expected) < 1.5, (s, measured, expected)
    assert 2 * torch.cos(1000 * theta).sum() < 0.5 * hd
