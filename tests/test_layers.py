"""gptbook.layers against PyTorch's own functions and against the NumPy mirror gptbook.scratch.layers."""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from gptbook import layers
from gptbook.layers import Block, FeedForward, RMSNorm, SwiGLU, make_ffn, make_norm, swiglu_d_ff
from gptbook.options import choices_of
from gptbook.positions import rope_angles
from gptbook.scratch import layers as npl

floats = st.floats(-20, 20, allow_nan=False, width=64)


def to_numpy(module):
    return {k: v.detach().double().numpy() for k, v in module.state_dict().items()}


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.integers(1, 50), elements=floats))
def test_gelu_matches_torch(x):
    t = torch.from_numpy(x)
    np.testing.assert_allclose(npl.gelu(x), F.gelu(t).numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(npl.gelu_tanh(x), F.gelu(t, approximate="tanh").numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(npl.silu(x), F.silu(t).numpy(), rtol=1e-12, atol=1e-14)


def test_gelu_known_values_and_dtype():
    # Phi(1) = 0.841344746..., so GELU(1) = 0.841344746 and GELU(-1) = -0.158655254
    np.testing.assert_allclose(npl.gelu(np.array([-1.0, 0.0, 1.0])), [-0.158655254, 0.0, 0.841344746], atol=1e-9)
    assert npl.gelu(np.ones(3, np.float32)).dtype == np.float32
    # the tanh form is an approximation: close to, but not equal to, the exact GELU
    x = np.linspace(-5, 5, 1001)
    gap = np.abs(npl.gelu(x) - npl.gelu_tanh(x)).max()
    assert 1e-5 < gap < 1e-3


def test_silu_does_not_overflow():
    with np.errstate(all="raise"):
        np.testing.assert_allclose(npl.silu(np.array([-1000.0, 1000.0])), [0.0, 1000.0], atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 4), st.integers(2, 33), st.sampled_from([1e-5, 1e-6, 1e-2]), st.booleans(), st.integers(0, 2**31 - 1)
)
def test_layer_norm_matches_nn_layernorm(n_tokens, d, eps, bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_tokens, d)) * rng.uniform(0.01, 100) + rng.normal()
    ln = torch.nn.LayerNorm(d, eps=eps, bias=bias).double()
    with torch.no_grad():
        ln.weight.normal_()
        if bias:
            ln.bias.normal_()
    ref = ln(torch.from_numpy(x)).detach().numpy()
    ours = npl.layer_norm(x, ln.weight.detach().numpy(), ln.bias.detach().numpy() if bias else None, eps)
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9)


def test_layer_norm_uses_biased_variance():
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    y = npl.layer_norm(x, np.ones(4), eps=0.0)
    expected = (x - 2.5) / math.sqrt(1.25)  # biased variance of 1..4 is 1.25 (unbiased: 1.667)
    np.testing.assert_allclose(y, expected, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 33), st.sampled_from([1e-5, 1e-6]), st.integers(0, 2**31 - 1))
def test_rms_norm_matches_torch(n_tokens, d, eps, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_tokens, d)) * rng.uniform(0.01, 100)
    norm = RMSNorm(d, eps=eps).double()
    with torch.no_grad():
        norm.weight.normal_()
    t = torch.from_numpy(x)
    ref = norm(t).detach().numpy()
    np.testing.assert_allclose(npl.rms_norm(x, norm.weight.detach().numpy(), eps), ref, rtol=1e-9, atol=1e-12)
    # an independent formula, written out
    w = norm.weight.detach().numpy()
    np.testing.assert_allclose(ref, x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w, rtol=1e-9, atol=1e-12)
    if hasattr(F, "rms_norm"):
        np.testing.assert_allclose(F.rms_norm(t, (d,), norm.weight.detach(), eps).detach().numpy(), ref, rtol=1e-12)


def test_rms_norm_fallback_path_matches(monkeypatch):
    "The code path for torch < 2.4 (no F.rms_norm) computes the same thing."
    norm = RMSNorm(16)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 5, 16)
    fused = norm(x)
    monkeypatch.delattr(F, "rms_norm", raising=False)
    torch.testing.assert_close(norm(x), fused, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [True, False])
def test_feed_forward_matches_numpy(activation, bias):
    torch.manual_seed(0)
    ffn = FeedForward(12, 20, activation=activation, bias=bias).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    p = to_numpy(ffn)
    ours = npl.feed_forward(p, x.numpy(), activation)
    np.testing.assert_allclose(ours, ffn(x).detach().numpy(), rtol=0, atol=1e-12)
    assert ffn.c_fc.weight.shape == (20, 12) and FeedForward(12).c_fc.weight.shape == (48, 12)


def test_feed_forward_acts_per_position():
    ffn = FeedForward(8)
    x = torch.randn(1, 6, 8)
    x2 = x.clone()
    x2[0, 3] = torch.randn(8)
    diff = (ffn(x) - ffn(x2)).abs().sum(-1)[0]
    assert diff[3] > 0 and torch.all(diff[[0, 1, 2, 4, 5]] == 0)


@pytest.mark.parametrize("bias", [True, False])
def test_swiglu_matches_numpy_and_formula(bias):
    torch.manual_seed(0)
    sw = SwiGLU(12, 20, bias=bias).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    p = to_numpy(sw)
    ours = npl.swiglu(p, x.numpy())
    np.testing.assert_allclose(ours, sw(x).detach().numpy(), rtol=0, atol=1e-12)
    g, u = sw.gate_proj(x), sw.up_proj(x)
    torch.testing.assert_close(sw(x), sw.down_proj(g * torch.sigmoid(g) * u))


def test_swiglu_d_ff_llama_sizes():
    # Llama 1/2 model cards: intermediate sizes 11008 (7B, d 4096), 13824 (13B, d 5120), 17920 (33B, d 6656)
    assert swiglu_d_ff(4096) == 11008
    assert swiglu_d_ff(5120) == 13824
    assert swiglu_d_ff(6656) == 17920
    assert swiglu_d_ff(768, multiple_of=1) == 2048
    assert swiglu_d_ff(100, multiple_of=8) == 272  # int(266.67) = 266 -> next multiple of 8
    assert SwiGLU(64).gate_proj.weight.shape == (256, 64)


def test_make_norm_and_make_ffn():
    assert isinstance(make_norm("layernorm", 8), torch.nn.LayerNorm)
    assert make_norm("layernorm", 8, bias=False).bias is None
    assert make_norm("layernorm", 8, eps=1e-6).eps == 1e-6
    assert isinstance(make_norm("rmsnorm", 8), RMSNorm) and make_norm("rmsnorm", 8, eps=1e-6).eps == 1e-6
    assert isinstance(make_ffn("swiglu", 8), SwiGLU)
    assert make_ffn("gelu", 8).activation == "gelu"
    with pytest.raises(ValueError, match="norm='batchnorm'"):
        make_norm("batchnorm", 8)
    with pytest.raises(ValueError, match="ffn='relu'"):
        make_ffn("relu", 8)
    with pytest.raises(ValueError, match="activation='relu'"):
        FeedForward(8, activation="relu")
    with pytest.raises(ValueError, match="norm_position='middle'"):
        Block(8, 2, norm_position="middle")
    assert choices_of(layers.FFNKind) == ("gelu", "gelu_tanh", "swiglu")


def test_numpy_factories_mirror_the_torch_ones():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    for norm in choices_of(layers.NormKind):
        module = make_norm(norm, 8, eps=1e-6).double()
        with torch.no_grad():
            for p in module.parameters():
                p.normal_()
            ref = module(x).numpy()
        np.testing.assert_allclose(npl.make_norm(to_numpy(module), norm, 1e-6)(x.numpy()), ref, rtol=0, atol=1e-12)
    for ffn in choices_of(layers.FFNKind):
        module = make_ffn(ffn, 8, 12).double()
        with torch.no_grad():
            ref = module(x).numpy()
        np.testing.assert_allclose(npl.make_ffn(to_numpy(module), ffn)(x.numpy()), ref, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="norm='batchnorm'"):
        npl.make_norm({}, "batchnorm")
    with pytest.raises(ValueError, match="ffn='relu'"):
        npl.make_ffn({}, "relu")
    with pytest.raises(KeyError, match="no 'c_fc.weight' in params"):
        npl.make_ffn({"c_fc.weights": np.zeros((12, 8))}, "gelu")(x.numpy())  # a misspelt key names itself


@pytest.mark.parametrize(
    "norm,norm_position,ffn,use_rope",
    list(itertools.product(*map(choices_of, (layers.NormKind, layers.NormPosition, layers.FFNKind)), [False, True])),
)
def test_block_matches_numpy(norm, norm_position, ffn, use_rope):
    torch.manual_seed(1)
    d_model, n_heads, n_kv_heads, T = 16, 4, 2, 7
    blk = Block(
        d_model,
        n_heads,
        n_kv_heads,
        d_ff=24,
        norm=norm,
        norm_position=norm_position,
        ffn=ffn,
        bias=(norm == "layernorm"),
        norm_eps=1e-6,
    ).double()
    with torch.no_grad():
        for p in blk.parameters():
            p.normal_(0, 0.4)  # norm gains and biases matter too
    x = torch.randn(2, T, d_model, dtype=torch.float64)
    rope = tuple(t.double() for t in rope_angles(T, d_model // n_heads)) if use_rope else None
    ref = blk(x, rope=rope).detach().numpy()
    np_rope = tuple(t.numpy() for t in rope) if use_rope else None
    ours = npl.block(to_numpy(blk), x.numpy(), n_heads, n_kv_heads, norm, norm_position, ffn, 1e-6, np_rope)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-10)


def test_block_is_two_residual_adds():
    "Pre-norm: out = x + attn(ln_1(x)) + mlp(ln_2(x + attn(ln_1(x)))), written out by hand."
    torch.manual_seed(0)
    blk = Block(16, 4)
    x = torch.randn(2, 5, 16)
    a = blk.attn(blk.ln_1(x))
    torch.testing.assert_close(blk(x), x + a + blk.mlp(blk.ln_2(x + a)))
    post = Block(16, 4, norm_position="post")
    h = post.ln_1(x + post.attn(x))
    torch.testing.assert_close(post(x), post.ln_2(h + post.mlp(h)))


def gpt2_block_by_hand(p, x, n_heads):
    "GPT-2's block from the raw tensors of a Block's state_dict: no module of gptbook, softmax attention written out."
    B, T, C = x.shape
    hd = C // n_heads
    h = F.layer_norm(x, (C,), p["ln_1.weight"], p["ln_1.bias"], 1e-5)
    q, k, v = F.linear(h, p["attn.c_attn.weight"], p["attn.c_attn.bias"]).split(C, dim=-1)
    q, k, v = (t.view(B, T, n_heads, hd).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    x = x + F.linear(y, p["attn.c_proj.weight"], p["attn.c_proj.bias"])
    h = F.layer_norm(x, (C,), p["ln_2.weight"], p["ln_2.bias"], 1e-5)
    h = F.gelu(F.linear(h, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"]), approximate="tanh")
    return x + F.linear(h, p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])


def test_default_block_is_gpt2s_block():
    "The defaults build GPT-2's block: checked against the block written out from its raw weights."
    torch.manual_seed(0)
    blk = Block(24, 3).double()
    with torch.no_grad():
        for prm in blk.parameters():
            prm.normal_(0, 0.3)
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    torch.testing.assert_close(blk(x), gpt2_block_by_hand(blk.state_dict(), x, 3), rtol=0, atol=1e-12)
    assert blk.state_dict()["mlp.c_fc.weight"].shape == (96, 24)  # 4 * d_model wide


def test_block_is_causal():
    torch.manual_seed(0)
    blk = Block(16, 4, ffn="swiglu", norm="rmsnorm")
    x = torch.randn(1, 8, 16)
    x2 = x.clone()
    x2[0, 5:] = torch.randn(3, 16)
    torch.testing.assert_close(blk(x)[0, :5], blk(x2)[0, :5])
    assert not torch.allclose(blk(x)[0, 5:], blk(x2)[0, 5:])


def test_block_kv_cache_matches_full():
    from gptbook.attention import KVCache

    torch.manual_seed(0)
    blk = Block(16, 4, n_kv_heads=2).eval()
    x = torch.randn(2, 9, 16)
    cos, sin = rope_angles(9, 4)
    full = blk(x, rope=(cos, sin))
    cache = KVCache(2, 2, 9, 4)
    parts = [blk(x[:, :4], rope=(cos[:4], sin[:4]), cache=cache)]
    parts += [blk(x[:, i : i + 1], rope=(cos[i : i + 1], sin[i : i + 1]), cache=cache) for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)


def test_scratch_layers_imports_numpy_only():
    import subprocess
    import sys

    code = (
        "import sys; import gptbook.scratch.layers, gptbook.scratch.model; "
        "bad = [m for m in ('torch', 'nbdev', 'fastcore') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
