"""gptbook.model: the config, the GPT module (causality, init, cache, dtypes, compile) and the NumPy mirror."""

import itertools
import json
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptbook.layers import FFNKind, NormKind, NormPosition
from gptbook.config import PRESETS
from gptbook.model import GPT, GPTConfig, lm_loss
from gptbook.options import OptionError, choices_of, field_types, split_optional
from gptbook.positions import LearnedPositions, NoPositions, PositionKind, RotaryPositions, SinusoidalPositions
from gptbook.scratch import model as npm

POSITIONS, NORMS, NORM_POSITIONS, FFNS = map(choices_of, (PositionKind, NormKind, NormPosition, FFNKind))

TINY = dict(vocab_size=37, max_seq_len=16, n_layers=2, n_heads=4, d_model=16, d_ff=24)


def randomize(model, std=0.4):
    "Random values everywhere, norm gains and biases included, so that no mix-up can hide behind ones and zeros."
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model


def numpy_params(model, dtype=np.float64):
    return {k: v.detach().cpu().numpy().astype(dtype) for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------------------------- config


def test_gpt2_small_parameter_count():
    with torch.device("meta"):
        m = GPT(GPTConfig.gpt2_small())
        untied = GPT(GPTConfig.gpt2_small(tie_weights=False))
    assert m.num_params() == 124_439_808
    assert untied.num_params() == 124_439_808 + 50257 * 768
    # independent count: GPT-2 small's published shapes, summed by hand
    V, T, d, L = 50257, 1024, 768, 12
    per_block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    assert m.num_params() == V * d + T * d + L * per_block + 2 * d
    assert m.num_params(exclude_embeddings=True) == 124_439_808 - V * d - T * d


def test_llama_style_parameter_count():
    cfg = GPTConfig.llama_style(vocab_size=1000, n_layers=3, n_heads=4, n_kv_heads=2, d_model=64, d_ff=160)
    with torch.device("meta"):
        m = GPT(cfg)
    V, d, L, f, kv = 1000, 64, 3, 160, 2 * 16
    per_block = 2 * d + d * (d + 2 * kv) + d * d + 3 * d * f  # two RMSNorms, q|k|v, o, gate/up/down; no biases
    assert m.num_params() == 2 * V * d + L * per_block + d  # untied embedding and head, final RMSNorm
    assert not any("bias" in n for n in m.state_dict())


def test_flops_per_token():
    with torch.device("meta"):
        m = GPT(GPTConfig.gpt2_small())
    N = 124_439_808 - 1024 * 768
    assert m.flops_per_token() == 6 * N + 12 * 12 * 768 * 1024
    assert m.flops_per_token(256, training=False) == 2 * N + 4 * 12 * 768 * 256
    assert m.mfu(1000.0, m.flops_per_token()) == pytest.approx(1000.0)
    with torch.device("meta"):
        untied = GPT(GPTConfig.llama_style(vocab_size=100, n_layers=2, n_heads=2, d_model=32, d_ff=64))
    assert untied.flops_per_token(8) == 6 * (untied.num_params() - 100 * 32) + 12 * 2 * 32 * 8


def test_presets():
    baby = GPTConfig.baby(65)
    assert (baby.vocab_size, baby.n_layers, baby.n_heads, baby.d_model, baby.max_seq_len) == (65, 4, 4, 128, 64)
    assert (baby.dropout, baby.norm, baby.norm_position, baby.positions, baby.ffn, baby.bias, baby.tie_weights) == (
        0.0,
        "layernorm",
        "pre",
        "learned",
        "gelu_tanh",
        True,
        True,
    )
    assert GPTConfig.baby(65, dropout=0.2).dropout == 0.2
    llama = GPTConfig.llama_style(n_kv_heads=4)
    assert (llama.norm, llama.positions, llama.ffn, llama.bias, llama.tie_weights, llama.resolved_kv_heads) == (
        "rmsnorm",
        "rope",
        "swiglu",
        False,
        False,
        4,
    )
    assert llama.resolved_d_ff == 2048 and GPTConfig().resolved_d_ff == 3072 and GPTConfig(d_ff=10).resolved_d_ff == 10
    assert GPTConfig().resolved_kv_heads == 12
    assert GPTConfig.gpt2_small() == GPTConfig()


def test_from_preset():
    assert PRESETS == ("baby", "gpt2-small", "llama-style", "speedrun")
    assert GPTConfig.from_preset("baby", 65) == GPTConfig.baby(65)
    assert GPTConfig.from_preset("gpt2-small", 50257) == GPTConfig.gpt2_small()
    assert GPTConfig.from_preset("llama-style", 100, n_layers=2) == GPTConfig.llama_style(vocab_size=100, n_layers=2)
    assert GPTConfig.from_preset("speedrun", 65, n_layers=2) == GPTConfig.baby(65, positions="rope", n_layers=2)
    with pytest.raises(ValueError, match="unknown preset 'tiny': use one of baby, gpt2-small, llama-style, speedrun"):
        GPTConfig.from_preset("tiny", 65)
    with pytest.raises(ValueError, match="unknown GPTConfig field"):
        GPTConfig.from_preset("baby", 65, n_layer=2)
    with pytest.raises(ValueError, match="n_layers must be at least 1, got 0"):
        GPTConfig.from_preset("baby", 65, n_layers=0)


def test_config_json_round_trip():
    cfg = GPTConfig.llama_style(n_kv_heads=3, n_heads=6, d_model=48, rope_base=5e5, dropout=0.1, norm_eps=1e-6)
    back = GPTConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and isinstance(back.rope_base, float)
    with pytest.raises(ValueError, match=r"unknown GPTConfig field\(s\) n_embd, n_layer;"):
        GPTConfig.from_dict({**cfg.to_dict(), "n_layer": 2, "n_embd": 3})


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("vocab_size", 0, "vocab_size must be at least 1, got 0"),
        ("max_seq_len", -1, "max_seq_len must be at least 1, got -1"),
        ("n_layers", 1.5, "n_layers must be an integer, got 1.5"),
        ("n_heads", 0, "n_heads must be at least 1, got 0"),
        ("d_model", 100, "d_model=100 is not divisible by n_heads=12"),
        ("n_kv_heads", 5, "n_kv_heads=5 does not divide n_heads=12"),
        ("n_kv_heads", 0, "n_kv_heads must be at least 1, got 0"),
        ("d_ff", 0, "d_ff must be at least 1, got 0"),
        ("norm", "batchnorm", "norm must be one of 'layernorm', 'rmsnorm', got 'batchnorm'"),
        ("norm_position", "middle", "norm_position must be one of 'pre', 'post', got 'middle'"),
        ("positions", "alibi", "positions must be one of 'learned', 'sinusoidal', 'rope', 'none', got 'alibi'"),
        ("ffn", "relu", "ffn must be one of 'gelu', 'gelu_tanh', 'swiglu', got 'relu'"),
        ("bias", 1, "bias must be true or false, got 1"),
        ("tie_weights", "yes", "tie_weights must be true or false, got 'yes'"),
        ("dropout", 1.0, "dropout must be in [0, 1), got 1.0"),
        ("dropout", -0.1, "dropout must be in [0, 1), got -0.1"),
        ("rope_base", 0.5, "rope_base must be > 1, got 0.5"),
        ("norm_eps", 0.0, "norm_eps must be positive, got 0.0"),
        ("use_sdpa", None, "use_sdpa must be true or false, got None"),
        ("vocab_size", True, "vocab_size must be an integer, got True"),
        ("rope_base", float("nan"), "rope_base must be a finite number, got nan"),
    ],
)
def test_bad_config_names_the_field(field, value, message):
    with pytest.raises(OptionError, match=re.escape(message)) as e:
        GPTConfig(**{field: value})
    assert e.value.field == field


def test_config_rope_and_sinusoidal_need_even_sizes():
    with pytest.raises(ValueError, match="head_dim=3"):
        GPTConfig(d_model=12, n_heads=4, positions="rope")
    with pytest.raises(ValueError, match="d_model=15"):
        GPTConfig(d_model=15, n_heads=5, positions="sinusoidal")
    GPTConfig(d_model=12, n_heads=4, positions="learned")  # odd head_dim is fine without RoPE


# -------------------------------------------------------------------------------------------- the model


@pytest.mark.parametrize(
    "positions,module", list(zip(POSITIONS, [LearnedPositions, SinusoidalPositions, RotaryPositions, NoPositions]))
)
def test_positions_module_behind_one_factory(positions, module):
    m = GPT(GPTConfig(**TINY, positions=positions))
    assert type(m.wpe) is module
    keys = list(m.state_dict())
    assert keys[:2] == (
        ["wte.weight", "wpe.weight"] if positions == "learned" else ["wte.weight", "blocks.0.ln_1.weight"]
    )
    assert not any(k.startswith("wpe") for k in keys) or positions == "learned"


def test_forward_loss_is_lm_loss():
    torch.manual_seed(0)
    m = GPT(GPTConfig(**TINY))
    idx, targets = torch.randint(0, 37, (2, 9)), torch.randint(0, 37, (2, 9))
    logits, loss = m(idx, targets=targets)
    assert torch.equal(loss, lm_loss(logits, targets))
    manual = -torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None]).mean()
    torch.testing.assert_close(loss.double(), manual, rtol=1e-6, atol=1e-6)


def test_state_dict_layout():
    m = GPT(GPTConfig(**TINY))
    sd = m.state_dict()
    assert sd["lm_head.weight"].data_ptr() == sd["wte.weight"].data_ptr()  # tied: one tensor
    assert list(sd)[:3] == ["wte.weight", "wpe.weight", "blocks.0.ln_1.weight"]
    for positions in ("sinusoidal", "rope", "none"):  # fixed tables are buffers, not saved
        keys = GPT(GPTConfig(**TINY, positions=positions)).state_dict().keys()
        assert not any(k.startswith(("wpe", "pe", "rope")) for k in keys)
    post = GPT(GPTConfig(**TINY, norm_position="post", tie_weights=False)).state_dict()
    assert (
        not any(k.startswith("ln_f") for k in post)
        and post["lm_head.weight"].data_ptr() != post["wte.weight"].data_ptr()
    )


def test_init_follows_gpt2():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=500, max_seq_len=64, n_layers=6, n_heads=4, d_model=128))

    def std(t):
        return t.detach().std().item()

    assert std(m.wte.weight) == pytest.approx(0.02, rel=0.05)
    assert std(m.wpe.weight) == pytest.approx(0.02, rel=0.05)
    assert std(m.blocks[0].attn.c_attn.weight) == pytest.approx(0.02, rel=0.05)
    assert std(m.blocks[0].mlp.c_fc.weight) == pytest.approx(0.02, rel=0.05)
    for p in (m.blocks[0].attn.c_proj.weight, m.blocks[5].mlp.c_proj.weight):
        assert std(p) == pytest.approx(0.02 / math.sqrt(12), rel=0.05)
    assert torch.all(m.blocks[2].ln_1.weight == 1) and torch.all(m.blocks[2].attn.c_attn.bias == 0)
    sw = GPT(GPTConfig.llama_style(vocab_size=500, n_layers=8, n_heads=4, d_model=128))
    assert std(sw.blocks[0].mlp.down_proj.weight) == pytest.approx(0.02 / 4, rel=0.05)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        dict(norm="rmsnorm", positions="rope", ffn="swiglu", bias=False, n_kv_heads=2),
        dict(norm_position="post", positions="sinusoidal", tie_weights=False),
    ],
)
def test_loss_at_init_is_near_log_vocab(kw):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=200, max_seq_len=32, n_layers=3, n_heads=4, d_model=64, **kw))
    idx, targets = torch.randint(0, 200, (8, 32)), torch.randint(0, 200, (8, 32))
    logits, loss = m(idx, targets=targets)
    assert loss.item() == pytest.approx(math.log(200), abs=0.1)
    assert loss.item() == pytest.approx(F.cross_entropy(logits.view(-1, 200), targets.view(-1)).item(), rel=1e-6)


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("norm_position", NORM_POSITIONS)
def test_model_is_causal(positions, norm_position):
    torch.manual_seed(0)
    m = randomize(GPT(GPTConfig(**TINY, positions=positions, norm_position=norm_position)), 0.2)
    idx = torch.randint(0, 37, (2, 16))
    for t in (0, 7, 15):
        idx2 = idx.clone()
        idx2[:, t] = (idx2[:, t] + 1) % 37
        a, b = m(idx), m(idx2)
        assert torch.equal(a[:, :t], b[:, :t])
        assert not torch.allclose(a[:, t], b[:, t])


@pytest.mark.parametrize(
    "kw",
    [
        {},
        dict(norm="rmsnorm", positions="rope", ffn="swiglu", bias=False, n_kv_heads=2, tie_weights=False),
        dict(norm_position="post", ffn="gelu", positions="sinusoidal"),
    ],
)
def test_gradients_reach_every_parameter(kw):
    torch.manual_seed(0)
    m = GPT(GPTConfig(**TINY, **kw))
    idx = torch.randint(0, 37, (2, 16))
    m(idx, targets=idx)[1].backward()
    names = [n for n, _ in m.named_parameters()]
    assert len(names) > 10
    for n, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


@pytest.mark.parametrize("kw", [{}, dict(positions="rope", n_kv_heads=1, norm="rmsnorm", ffn="swiglu")])
def test_sdpa_and_manual_attention_agree(kw):
    torch.manual_seed(0)
    fused = randomize(GPT(GPTConfig(**TINY, **kw)), 0.3)
    manual = GPT(GPTConfig(**TINY, **kw, use_sdpa=False))
    manual.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 37, (3, 16))
    torch.testing.assert_close(manual(idx), fused(idx), rtol=1e-5, atol=1e-5)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    m = GPT(GPTConfig(**{**TINY, "max_seq_len": 16}, dropout=0.3))
    idx = torch.randint(0, 37, (2, 16))
    m.train()
    assert not torch.allclose(m(idx), m(idx))
    m.eval()
    assert torch.equal(m(idx), m(idx))


def test_bad_inputs():
    m = GPT(GPTConfig(**TINY))
    with pytest.raises(ValueError, match="positions 0..16 exceed max_seq_len=16"):
        m(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("bad,id_", [([[0, 37]], 37), ([[-1, 3]], -1), ([[3, 10**6]], 10**6)])
def test_forward_names_an_out_of_range_id_and_the_vocab_size(bad, id_):
    m = GPT(GPTConfig(**TINY))
    for dtype in (torch.long, torch.int32):  # on a GPU, an id outside the table would be a bare device assert
        with pytest.raises(
            ValueError, match=rf"token id {id_} in idx is outside the vocabulary 0\.\.36 \(vocab_size=37\)"
        ):
            m(torch.tensor(bad, dtype=dtype))


def test_forward_keeps_the_ignore_index_and_takes_empty_batches():
    m = GPT(GPTConfig(**TINY))
    _, loss = m(torch.tensor([[1, 2, 3]]), targets=torch.tensor([[-100, 2, 3]]))  # cross_entropy's ignore_index
    assert torch.isfinite(loss)
    assert m(torch.zeros(0, 4, dtype=torch.long)).shape == (0, 4, 37)  # empty batches need no check


def _float_fields(cls):
    return [name for name, hint in field_types(cls).items() if split_optional(hint)[0] is float]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("name", _float_fields(GPTConfig))
def test_config_float_fields_refuse_nan_and_inf(name, bad):
    with pytest.raises(OptionError, match=f"{name} must be a finite number") as e:
        GPTConfig(**TINY, **{name: bad})
    assert e.value.field == name
    assert set(_float_fields(GPTConfig)) == {"dropout", "rope_base", "norm_eps"}  # the ones the review names


# ------------------------------------------------------------------------------------------ the KV cache


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("kw", [{}, dict(n_kv_heads=2, norm="rmsnorm", ffn="swiglu"), dict(norm_position="post")])
def test_incremental_decoding_matches_full_forward(positions, kw):
    torch.manual_seed(0)
    m = randomize(GPT(GPTConfig(**TINY, positions=positions, **kw)), 0.2).eval()
    idx = torch.randint(0, 37, (3, 16))
    with torch.no_grad():
        full = m(idx)
        cache = m.make_cache(3)
        steps = [m(idx[:, :5], cache=cache)]  # the prompt at once
        steps += [m(idx[:, i : i + 1], cache=cache) for i in range(5, 12)]  # then one token at a time
        steps += [m(idx[:, 12:], cache=cache)]  # and a chunk again
    assert cache[0].pos == cache[-1].pos == 16
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_make_cache_shapes_and_defaults():
    m = GPT(GPTConfig(**TINY, n_kv_heads=2)).double()
    cache = m.make_cache(5)
    assert len(cache) == 2 and cache[0].k.shape == (5, 2, 16, 4) and cache[0].k.dtype == torch.float64
    cache = m.make_cache(1, max_seq_len=40, dtype=torch.float32)
    assert cache[1].v.shape == (1, 2, 40, 4) and cache[1].v.dtype == torch.float32
    assert cache[0] is not cache[1] and cache[0].k.data_ptr() != cache[1].k.data_ptr()


def test_learned_positions_refuse_to_run_past_max_seq_len_with_a_cache():
    m = GPT(GPTConfig(**TINY))
    cache = m.make_cache(1, max_seq_len=32)
    m(torch.zeros(1, 14, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"positions 14\.\.17 exceed max_seq_len=16"):
        m(torch.zeros(1, 4, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("positions", ["rope", "sinusoidal"])
def test_rope_and_sinusoidal_extrapolate_past_max_seq_len(positions):
    torch.manual_seed(0)
    m = randomize(GPT(GPTConfig(**TINY, positions=positions)), 0.2).eval()
    idx = torch.randint(0, 37, (2, 24))  # 24 > max_seq_len = 16
    with torch.no_grad():
        full = m(idx)
        cache = m.make_cache(2, max_seq_len=24)
        steps = [m(idx[:, :14], cache=cache)] + [m(idx[:, i : i + 1], cache=cache) for i in range(14, 24)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    big = GPT(GPTConfig(**{**TINY, "max_seq_len": 24}, positions=positions))
    big.load_state_dict(m.state_dict())
    torch.testing.assert_close(big(idx), full)  # the same as a model built with a longer table


# ------------------------------------------------------------------------------------ the NumPy mirror

SWITCHES = list(itertools.product(NORMS, NORM_POSITIONS, POSITIONS, FFNS, [True, False]))


@pytest.mark.parametrize("norm,norm_position,positions,ffn,tie_weights", SWITCHES)
def test_numpy_forward_matches_torch_float64(norm, norm_position, positions, ffn, tie_weights):
    cfg = GPTConfig(
        **TINY,
        n_kv_heads=2,
        norm=norm,
        norm_position=norm_position,
        positions=positions,
        ffn=ffn,
        tie_weights=tie_weights,
        bias=(ffn != "swiglu"),
        norm_eps=1e-6,
    )
    torch.manual_seed(0)
    m = randomize(GPT(cfg)).double()
    idx = torch.randint(0, 37, (2, 11))
    ref = m(idx).detach().numpy()
    ours = npm.forward(numpy_params(m), idx.numpy(), cfg)
    assert ours.shape == (2, 11, 37) and ours.dtype == np.float64
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    "kw", [{}, dict(norm="rmsnorm", positions="rope", ffn="swiglu", bias=False, n_kv_heads=2, tie_weights=False)]
)
def test_numpy_forward_float32(kw):
    "float32 on both sides: equal to about 1e-6 on logits of size ~1-10; the test allows 1e-4."
    cfg = GPTConfig(**TINY, **kw)
    torch.manual_seed(0)
    m = randomize(GPT(cfg), 0.3)
    idx = torch.randint(0, 37, (2, 16))
    ours = npm.forward(numpy_params(m, np.float32), idx.numpy(), cfg.to_dict())  # a dict config works too
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, m(idx).detach().numpy(), rtol=0, atol=1e-4)


def test_numpy_forward_errors():
    cfg = GPTConfig(**TINY)
    params = numpy_params(GPT(cfg))
    with pytest.raises(ValueError, match=r"0\.\.36"):
        npm.forward(params, np.array([[0, 37]]), cfg)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        npm.forward(params, np.array([0, 1]), cfg)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        npm.forward(params, np.zeros((1, 17), int), cfg)
    with pytest.raises(ValueError, match="no field 'n_layers'"):
        npm.forward(params, np.zeros((1, 2), int), {"vocab_size": 37})


# ---------------------------------------------------------------------------- dtypes, devices, compile


def test_bfloat16_autocast_and_float64():
    torch.manual_seed(0)
    m = GPT(GPTConfig.baby(65)).eval()
    idx = torch.randint(0, 65, (2, 64))
    with torch.no_grad():
        ref = m(idx)
        assert ref.dtype == torch.float32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = m(idx)
        assert low.dtype == torch.bfloat16
        torch.testing.assert_close(low.float(), ref, rtol=0, atol=0.05)
        m64 = GPT(GPTConfig.baby(65, positions="rope")).double()
        assert m64(idx).dtype == torch.float64 and m64.wpe.cos.dtype == torch.float64


@pytest.mark.slow
def test_torch_compile_on_cpu_matches_eager():
    torch.manual_seed(0)
    m = GPT(GPTConfig.baby(65, n_layers=2))
    idx = torch.randint(0, 65, (2, 64))
    compiled = torch.compile(m)
    logits, loss = compiled(idx, targets=idx)
    ref_logits, ref_loss = m(idx, targets=idx)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    ref_loss.backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-3, atol=1e-5, msg=n)


def test_empty_input_gives_empty_logits_on_both_sides():
    from gptbook.scratch.embedding import embed

    cfg = GPTConfig.baby(65)
    model = GPT(cfg)
    params = {k: v.numpy() for k, v in model.state_dict().items()}
    assert npm.forward(params, np.zeros((2, 0), dtype=np.int64), cfg).shape == (2, 0, 65)
    assert tuple(model(torch.zeros(2, 0, dtype=torch.long)).shape) == (2, 0, 65)
    assert embed(np.zeros((5, 3)), []).shape == (0, 3)


# ------------------------------------------------------------------ embed_scale (the 2017 remedy for sinusoids)


def _manual_logits(m, idx, scale):
    "wte(idx) * scale + the position table, the blocks, ln_f, the head: the forward pass written out."
    x = m.wte(idx) * scale
    if m.config.positions == "learned":
        x = x + m.wpe.weight[: idx.shape[1]]
    else:
        x = x + m.wpe.pe[: idx.shape[1]]
    for blk in m.blocks:
        x = blk(x)
    return m.lm_head(m.ln_f(x))


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_embed_scale_multiplies_the_token_embeddings_only(positions):
    torch.manual_seed(0)
    off = randomize(GPT(GPTConfig(**TINY, positions=positions)), 0.2).eval()
    assert off.config.embed_scale is False  # the default: GPT-2's forward, unchanged
    on = GPT(GPTConfig(**TINY, positions=positions, embed_scale=True)).eval()
    assert on.state_dict().keys() == off.state_dict().keys()  # no new tensor: the same checkpoints
    on.load_state_dict(off.state_dict())
    idx = torch.randint(0, 37, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(off(idx), _manual_logits(off, idx, 1.0), rtol=0, atol=1e-6)
        torch.testing.assert_close(on(idx), _manual_logits(on, idx, math.sqrt(16)), rtol=0, atol=1e-6)
        assert (on(idx) - off(idx)).abs().max() > 1e-2  # the switch does something


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope"])
def test_numpy_forward_matches_torch_with_embed_scale(positions):
    cfg = GPTConfig(**TINY, positions=positions, embed_scale=True)
    torch.manual_seed(0)
    m = randomize(GPT(cfg)).double()
    idx = torch.randint(0, 37, (2, 11))
    ours = npm.forward(numpy_params(m), idx.numpy(), cfg)
    np.testing.assert_allclose(ours, m(idx).detach().numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(npm.forward(numpy_params(m), idx.numpy(), cfg.to_dict()), ours, rtol=0, atol=0)
    plain = npm.forward(numpy_params(m), idx.numpy(), cfg.replace(embed_scale=False))
    assert np.abs(plain - ours).max() > 1e-2


def test_configs_written_before_embed_scale_still_load(tmp_path):
    "A run's config from before the field existed has no embed_scale key: it reads back as False, everywhere."
    from gptbook.checkpoint import load_checkpoint, save_checkpoint

    cfg = GPTConfig(**TINY, positions="sinusoidal")
    old = {k: v for k, v in cfg.to_dict().items() if k != "embed_scale"}
    assert "embed_scale" not in old and GPTConfig.from_dict(old) == cfg
    torch.manual_seed(0)
    m = randomize(GPT(cfg), 0.2).eval()
    folder = save_checkpoint(tmp_path, 1, m, meta={"model_config": old})
    back = load_checkpoint(folder).model
    assert back.config.embed_scale is False
    idx = torch.randint(0, 37, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(back(idx), m(idx), rtol=0, atol=0)
    params = numpy_params(m.double())
    np.testing.assert_allclose(
        npm.forward(params, idx.numpy(), old), m(idx).detach().numpy(), rtol=0, atol=1e-9
    )  # the NumPy mirror reads an old config dict too
