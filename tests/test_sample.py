"""Tests for gptbook.sample: filters against a NumPy reference and hypothesis properties; generation
with and without the KV cache (a stand-in model and the real GPT, every position type and GQA, past
max_seq_len); seeded reproducibility; batches of ragged prompts vs one by one; UTF-8 streaming and
stop strings; SamplingConfig: the only check of the settings, once per call, given as keywords or as config=."""

import codecs
import dataclasses
import inspect
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

import gptbook.options
import gptbook.sample
from gptbook.options import OptionError
from gptbook.adapters import TokenizerAdapter, as_tokenizer
from gptbook.tokenizer import BPETokenizer, CharTokenizer
from gptbook.sample import (
    SamplingConfig,
    apply_repetition_penalty,
    apply_temperature,
    filter_logits,
    generate,
    generate_steps,
    min_p_filter,
    pad_prompts,
    sample_next_token,
    stream,
    top_k_filter,
    top_p_filter,
)

SETTINGS = settings(max_examples=60, deadline=None)  # random examples: a new search on every run


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

# ---------------------------------------------------------------- NumPy references (loops, float64)


def np_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z[np.isfinite(z)].max())
    return e / e.sum()


def ref_top_k(z, k):
    "Keep every logit >= the k-th largest (ties with it kept), by sorting in Python."
    z = np.asarray(z, dtype=np.float64)
    kth = sorted(z.tolist(), reverse=True)[min(k, len(z)) - 1]
    return np.where(z >= kth, z, -np.inf)


def ref_top_p(z, p):
    "Add tokens from most to least likely until their mass reaches p."
    z = np.asarray(z, dtype=np.float64)
    if p >= 1:
        return z.copy()
    probs = np_softmax(z)
    order = sorted(range(len(z)), key=lambda i: -probs[i])
    keep, mass = set(), 0.0
    for i in order:
        keep.add(i)
        mass += probs[i]
        if mass >= p:
            break
    return np.array([z[i] if i in keep else -np.inf for i in range(len(z))])


def ref_min_p(z, min_p):
    probs = np_softmax(z)
    return np.where(probs >= min_p * probs.max(), np.asarray(z, dtype=np.float64), -np.inf)


def ref_repetition(z, context, penalty):
    z = np.asarray(z, dtype=np.float64).copy()
    for t in set(context):
        z[t] = z[t] / penalty if z[t] > 0 else z[t] * penalty
    return z


logit_lists = st.lists(st.floats(-20, 20, allow_nan=False, width=64), min_size=1, max_size=40)


def _finite_set(t):
    return set(np.flatnonzero(np.isfinite(np.asarray(t))).tolist())


# ---------------------------------------------------------------- filters vs reference


def seen_mask(context, vocab_size):
    "The tokens of `context` (..., T) as the mask (..., vocab_size) apply_repetition_penalty takes."
    return torch.zeros(*context.shape[:-1], vocab_size, dtype=torch.bool).scatter(-1, context, True)


def test_filters_match_reference_on_random_logits():
    g = np.random.default_rng(0)
    for _ in range(200):
        V = int(g.integers(1, 300))
        z = g.normal(0, 3, V)
        t = torch.tensor(z)
        k, p, m = int(g.integers(1, V + 5)), float(g.uniform(0.01, 1.0)), float(g.uniform(0, 1))
        np.testing.assert_array_equal(top_k_filter(t, k).numpy(), ref_top_k(z, k))
        np.testing.assert_array_equal(top_p_filter(t, p).numpy(), ref_top_p(z, p))
        np.testing.assert_array_equal(min_p_filter(t, m).numpy(), ref_min_p(z, m))
        T = float(g.uniform(0.05, 3))
        np.testing.assert_allclose(apply_temperature(t, T).numpy(), (z - z.max()) / T, rtol=1e-12)
        ctx = g.integers(0, V, int(g.integers(1, 20)))
        pen = float(g.uniform(0.5, 2))
        np.testing.assert_allclose(
            apply_repetition_penalty(t, seen_mask(torch.tensor(ctx), V), pen).numpy(),
            ref_repetition(z, ctx, pen),
            rtol=1e-12,
        )


def test_filters_batched_rows_are_independent():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(7, 50, generator=g) * 3
    for f in [lambda x: top_k_filter(x, 5), lambda x: top_p_filter(x, 0.8), lambda x: min_p_filter(x, 0.1)]:
        torch.testing.assert_close(f(z), torch.stack([f(row) for row in z]))
    seen = seen_mask(torch.randint(50, (7, 9), generator=g), 50)
    torch.testing.assert_close(
        apply_repetition_penalty(z, seen, 1.3),
        torch.stack([apply_repetition_penalty(r, c, 1.3) for r, c in zip(z, seen)]),
    )


def test_top_p_reaching_p_exactly_is_enough():
    # four equal tokens: cumulative mass 0.25, 0.5, 0.75, 1.0 exactly in binary floating point
    for p, n in [(0.25, 1), (0.26, 2), (0.5, 2), (0.75, 3), (0.76, 4), (1.0, 4)]:
        assert int(top_p_filter(torch.zeros(4), p).isfinite().sum()) == n, p


@SETTINGS
@given(logit_lists, st.floats(0.001, 1.0))
def test_top_p_keeps_the_minimal_set_reaching_p(z, p):
    probs = np_softmax(z)
    kept = _finite_set(top_p_filter(torch.tensor(z, dtype=torch.float64), p))
    assert kept, "top-p removed every token"
    mass = probs[list(kept)].sum()
    assert mass >= p - 1e-9  # reaches p
    if p < 1:  # minimal: dropping the least likely kept token falls below p
        assert mass - probs[list(kept)].min() < p + 1e-9
    removed = set(range(len(z))) - kept
    if removed:  # the kept tokens are the most likely ones
        assert probs[list(kept)].min() >= probs[list(removed)].max() - 1e-12


@SETTINGS
@given(logit_lists, st.integers(1, 60))
def test_top_k_keeps_the_k_largest(z, k):
    kept = _finite_set(top_k_filter(torch.tensor(z, dtype=torch.float64), k))
    assert min(k, len(z)) <= len(kept)  # ties with the k-th can only add
    zs = sorted(z, reverse=True)
    assert kept == {i for i, v in enumerate(z) if v >= zs[min(k, len(z)) - 1]}


@SETTINGS
@given(logit_lists)
def test_temperature_to_zero_is_greedy(z):
    t = torch.tensor(z, dtype=torch.float64)
    greedy = apply_temperature(t, 0)
    assert _finite_set(greedy) == {i for i, v in enumerate(z) if v == max(z)}
    top = int(t.argmax())
    zs = sorted(z, reverse=True)
    gap = zs[0] - zs[1] if len(z) > 1 else math.inf
    if gap > 0.5:  # a clear winner: at T = 0.01 the softmax is one-hot to double precision
        assert float(apply_temperature(t, 0.01).softmax(-1)[top]) == pytest.approx(1.0, abs=1e-12)
        assert int(sample_next_token(t[None], temperature=0.01, generator=torch.Generator().manual_seed(0))) == top
    assert int(sample_next_token(t[None], temperature=0)) == top


@SETTINGS
@given(
    st.lists(st.one_of(st.floats(-30, 30, width=32), st.just(-math.inf)), min_size=1, max_size=40).filter(
        lambda z: any(math.isfinite(v) for v in z)
    ),
    st.floats(0, 3),
    st.one_of(st.none(), st.integers(1, 50)),
    st.one_of(st.none(), st.floats(0.001, 1.0)),
    st.one_of(st.none(), st.floats(0, 1)),
)
def test_filters_never_remove_every_token(z, T, k, p, m):
    t = torch.tensor(z, dtype=torch.float32)
    out = filter_logits(t, T, k, p, m)
    kept = _finite_set(out)
    assert kept, "a filter left no token to sample"
    assert int(t.argmax()) in kept  # the most likely token always survives
    assert kept <= _finite_set(t)  # filters only remove
    tok = int(sample_next_token(t[None], T, k, p, m, generator=torch.Generator().manual_seed(1)))
    assert tok in kept


@pytest.mark.parametrize(
    "field, bad, msg",
    [
        ("temperature", -1.0, "temperature must be >= 0, got -1.0 (0 means greedy"),
        ("temperature", math.nan, "temperature must be a finite number, got nan"),
        ("temperature", math.inf, "temperature must be a finite number, got inf"),
        ("temperature", "hot", "temperature must be a number, got 'hot'"),
        ("top_k", 0, "top_k must be at least 1, got 0"),
        ("top_k", 2.5, "top_k must be an integer, got 2.5"),
        ("top_p", 0.0, "top_p must be in (0, 1]"),
        ("top_p", 1.01, "top_p must be in (0, 1]"),
        ("top_p", True, "top_p must be a number, got True"),
        ("min_p", -0.1, "min_p must be in [0, 1]"),
        ("repetition_penalty", -1.0, "repetition_penalty must be positive"),
        ("max_new_tokens", -1, "max_new_tokens must be in [0, 1000000]"),
    ],
)
def test_bad_settings_are_one_line_naming_the_field(field, bad, msg):
    with pytest.raises(OptionError, match=re.escape(msg)) as e:
        SamplingConfig(**{field: bad})
    assert e.value.field == field and "\n" not in str(e.value)


def test_the_chapters_filter_examples():
    "The examples chapter 9 states in prose, beside the few it shows: edge cases of each filter and of the config."
    inf = math.inf
    assert torch.equal(apply_temperature(torch.tensor([1.0, 3.0, 3.0, 0.0]), 0), torch.tensor([-inf, 3.0, 3.0, -inf]))
    z = torch.tensor([3.2, 2.6, 2.3, -1.0])
    torch.testing.assert_close(apply_temperature(z, 1.0).softmax(-1), z.softmax(-1), rtol=0, atol=1e-7)
    torch.testing.assert_close(
        apply_temperature(z, 0.01).softmax(-1), apply_temperature(z, 0).softmax(-1), atol=1e-6, rtol=0
    )
    assert torch.equal(top_k_filter(torch.tensor([1.0, 3.0, 2.0]), 100), torch.tensor([1.0, 3.0, 2.0]))  # k > V
    assert torch.equal(top_k_filter(torch.tensor([[1.0, 2.0, 2.0, 0.0]]), 2), torch.tensor([[-inf, 2.0, 2.0, -inf]]))
    p = torch.tensor([0.5, 0.3, 0.2]).log()
    assert top_p_filter(p, 0.01).isfinite().tolist() == [True, False, False]  # never empty
    assert torch.equal(top_p_filter(p, 1.0), p)
    assert top_p_filter(p[[2, 0, 1]], 0.7).isfinite().tolist() == [False, True, True]  # vocabulary order is no matter
    assert SamplingConfig.from_dict(SamplingConfig(stop=[1, 2]).to_dict()) == SamplingConfig(stop=(1, 2))
    with pytest.raises(OptionError, match=re.escape("stop must be >= 0, got -1")):
        SamplingConfig(stop=[-1])
    with pytest.raises(OptionError, match="temperature must be >= 0"):
        SamplingConfig(temperature=0.8).replace(temperature=-1)


def test_filters_check_only_their_logits():
    "The settings were checked by SamplingConfig; a filter refuses only logits that are not a float tensor."
    for call in [
        lambda z: apply_temperature(z, 0.5),
        lambda z: top_k_filter(z, 2),
        lambda z: top_p_filter(z, 0.5),
        lambda z: min_p_filter(z, 0.1),
        lambda z: apply_repetition_penalty(z, torch.ones(2, dtype=torch.bool), 1.2),
        lambda z: sample_next_token(z),
    ]:
        with pytest.raises(TypeError, match="floating-point"):
            call(torch.tensor([[1, 2]]))
        with pytest.raises(TypeError, match="floating-point"):
            call([[1.0, 2.0]])


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "repetition_penalty"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_float_settings_refuse_nan_and_inf(name, bad):
    with pytest.raises(OptionError, match=f"{name} must be a finite number") as e:
        SamplingConfig(**{name: bad})
    assert e.value.field == name


def test_sampling_follows_the_filtered_distribution():
    z = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])
    n = 40_000
    draws = sample_next_token(z.repeat(n, 1), temperature=0.7, top_p=0.8, generator=torch.Generator().manual_seed(0))
    freq = np.bincount(draws.numpy(), minlength=6) / n
    want = np_softmax(ref_top_p(z.numpy() / 0.7, 0.8))
    np.testing.assert_allclose(freq, want, atol=0.01)  # ~4 standard errors at n = 40,000


# ---------------------------------------------------------------- a stand-in model with a cache


class _Cfg:
    def __init__(self, vocab_size, max_seq_len):
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len


class _SumCache:
    "The stand-in's cache: a running sum of inputs and the number of positions seen."

    def __init__(self, B, d, max_seq_len):
        self.sum, self.pos, self.max_seq_len = torch.zeros(B, 1, d), 0, max_seq_len


class RunningMeanLM(nn.Module):
    """logits_t = W(mean of (token + position embeddings) over positions 0..t): causal, sensitive to
    every token of its window and to positions, with an exact O(1)-per-step cache."""

    def __init__(self, vocab_size=23, max_seq_len=12, d=16, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.config = _Cfg(vocab_size, max_seq_len)
        self.tok = nn.Parameter(torch.randn(vocab_size, d, generator=g, dtype=torch.float64))
        self.pos = nn.Parameter(torch.randn(max_seq_len, d, generator=g, dtype=torch.float64))
        self.head = nn.Parameter(torch.randn(d, vocab_size, generator=g, dtype=torch.float64) * 3)
        self.calls = []  # (T, cached) of each forward, to check how the loop used the model

    def make_cache(self, batch_size, device=None, dtype=None):
        return _SumCache(batch_size, self.tok.size(1), self.config.max_seq_len)

    def forward(self, idx, cache=None):
        B, T = idx.shape
        start = 0 if cache is None else cache.pos
        if start + T > (self.config.max_seq_len if cache is None else cache.max_seq_len):
            raise ValueError("positions beyond the context")  # like the real model's tables and KVCache
        self.calls.append((T, cache is not None))
        x = self.tok[idx] + self.pos[start : start + T]  # (B, T, d)
        s = x.cumsum(1) + (0 if cache is None else cache.sum)  # (B, T, d)
        if cache is not None:
            cache.sum, cache.pos = s[:, -1:], start + T
        h = s / torch.arange(start + 1, start + T + 1, dtype=s.dtype)[:, None]
        return (h @ self.head).float()  # (B, T, V)


def plain_loop(model, idx, n, pick):
    "Independent reference: crop to the context, run the model, pick from the last logits, append."
    for _ in range(n):
        z = model(idx[:, -model.config.max_seq_len :])[:, -1]  # (B, V)
        idx = torch.cat([idx, pick(z, idx)[:, None]], 1)
    return idx


def test_greedy_matches_reference_loop_past_the_context():
    m = RunningMeanLM()
    idx = torch.randint(23, (3, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = plain_loop(m, idx, 30, lambda z, _: z.argmax(-1))  # 5 + 30 > max_seq_len 12
    for use_cache in [True, False]:
        torch.testing.assert_close(generate(m, idx, 30, temperature=0, use_cache=use_cache), want, rtol=0, atol=0)


def test_cache_is_used_until_the_context_is_full_then_dropped():
    m = RunningMeanLM()
    list(generate_steps(m, torch.zeros(1, 5, dtype=torch.long), 10, temperature=0))
    # prefill of 5, then single cached tokens up to length 12, then full 12-token windows without the cache
    assert m.calls == [(5, True)] + [(1, True)] * 7 + [(12, False)] * 2
    m.calls.clear()
    list(generate_steps(m, torch.zeros(1, 5, dtype=torch.long), 3, use_cache=False))
    assert m.calls == [(5, False), (6, False), (7, False)]


def test_cache_logits_equal_plain_logits_at_every_step():
    m = RunningMeanLM()
    idx = torch.randint(23, (2, 3), generator=torch.Generator().manual_seed(2))
    fast = list(generate_steps(m, idx, 25, temperature=0))
    slow = list(generate_steps(m, idx, 25, temperature=0, use_cache=False))
    for (t1, z1), (t2, z2) in zip(fast, slow):
        assert torch.equal(t1, t2)
        torch.testing.assert_close(z1, z2, rtol=1e-5, atol=1e-5)


def test_sampling_matches_reference_with_the_same_generator():
    m = RunningMeanLM()
    idx = torch.randint(23, (2, 4), generator=torch.Generator().manual_seed(3))

    def pick(z, ctx, g):  # the NumPy reference filters, then the same multinomial draw
        rows = []
        for row, c in zip(z.double().numpy(), ctx.numpy()):
            row = ref_top_p(ref_top_k(ref_repetition(row, c, 1.2) / 0.9, 10), 0.85)
            rows.append(np_softmax(row))
        return torch.multinomial(torch.tensor(np.array(rows), dtype=torch.float32), 1, generator=g).squeeze(-1)

    g_ref = torch.Generator().manual_seed(5)
    with torch.no_grad():
        want = plain_loop(m, idx, 20, lambda z, ctx: pick(z, ctx, g_ref))
    cfg = SamplingConfig(max_new_tokens=20, temperature=0.9, top_k=10, top_p=0.85, repetition_penalty=1.2)
    got = generate(m, idx, config=cfg, generator=torch.Generator().manual_seed(5))
    assert torch.equal(got, want)


def test_seeded_generation_is_reproducible_and_seed_dependent():
    m = RunningMeanLM()
    idx = torch.zeros(2, 3, dtype=torch.long)

    def run(seed):
        return generate(m, idx, 30, temperature=1.0, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(0), run(0))
    assert not torch.equal(run(0), run(1))
    torch.manual_seed(0)
    a = generate(m, idx, 30)
    torch.manual_seed(0)
    b = generate(m, idx, 30)
    assert torch.equal(a, b)  # without a generator, the global seed decides


@pytest.mark.parametrize("use_cache", [True, False])
def test_ragged_batch_equals_one_by_one(use_cache):
    m = RunningMeanLM()
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(23, (n,), generator=g).tolist() for n in [1, 6, 3, 6, 14]]  # 14 > max_seq_len
    idx, mask = pad_prompts(prompts, pad_id=7)
    cfg = SamplingConfig(max_new_tokens=15, temperature=0, use_cache=use_cache, repetition_penalty=1.5)
    out = generate(m, idx, config=cfg, attention_mask=mask)
    assert out.shape == (5, 14 + 15)
    for i, p in enumerate(prompts):
        alone = generate(m, torch.tensor([p]), config=cfg)
        assert torch.equal(out[i, 14 - len(p) :], alone[0]), i
        assert (out[i, : 14 - len(p)] == 7).all()  # the padding is kept as given


def test_stop_tokens_end_rows_and_generation():
    m = RunningMeanLM()
    idx = torch.randint(23, (4, 3), generator=torch.Generator().manual_seed(6))
    free = generate(m, idx, 20, temperature=1.0, generator=torch.Generator().manual_seed(0))
    stop = [int(free[0, 5]), int(free[1, 8])]
    out = generate(
        m, idx, config=SamplingConfig(max_new_tokens=20, stop=stop), generator=torch.Generator().manual_seed(0)
    )
    for row_free, row in zip(free, out):
        new_free, new = row_free[3:].tolist(), row[3:].tolist()
        hits = [j for j, t in enumerate(new_free) if t in stop]
        if not hits:
            assert new == new_free
        else:
            j = hits[0]
            assert new[: j + 1] == new_free[: j + 1] and set(new[j:]) == {new_free[j]}
    assert out.shape[1] <= free.shape[1]
    # a single row stops early: the output is shorter
    free1 = generate(m, idx[:1], 20, temperature=1.0, generator=torch.Generator().manual_seed(0))[0, 3:].tolist()
    cfg = SamplingConfig(max_new_tokens=20, stop=free1[6])
    one = generate(m, idx[:1], config=cfg, generator=torch.Generator().manual_seed(0))
    assert one[0, 3:].tolist() == free1[: free1.index(free1[6]) + 1]


def test_forced_prompt_tokens_never_trigger_stop():
    m = RunningMeanLM()
    idx, mask = pad_prompts([[1, 2, 3, 4, 5], [9]])
    cfg = SamplingConfig(max_new_tokens=4, temperature=0, stop=3)  # 3 is in the first prompt
    out = generate(m, idx, config=cfg, attention_mask=mask)
    alone = generate(m, torch.tensor([[1, 2, 3, 4, 5]]), config=cfg)
    assert torch.equal(out[0, : alone.shape[1]], alone[0])


@pytest.mark.parametrize(
    "kwargs, fields, exc, msg",
    [
        (dict(temperature=-0.1), {}, ValueError, "temperature must be >= 0"),
        (dict(top_p=0), {}, ValueError, "top_p must be in (0, 1]"),
        (dict(top_p=2), {}, ValueError, "top_p must be in (0, 1]"),
        (dict(top_k=0), {}, ValueError, "top_k must be at least 1"),
        ({}, dict(min_p=3), ValueError, "min_p must be in [0, 1]"),
        ({}, dict(repetition_penalty=0), ValueError, "repetition_penalty must be"),
        ({}, dict(stop=99), ValueError, "stop token id 99 is outside the model's vocabulary 0..22"),
        ({}, dict(stop=[]), ValueError, "stop must hold at least one value (None for none)"),
        ({}, dict(stop=[1, -2]), ValueError, "stop must be >= 0, got -2"),
        ({}, dict(stop=True), ValueError, "stop must be an integer, got True"),
        ({}, dict(stop=2.0), ValueError, "stop must be a tuple, got 2.0"),
        ({}, dict(stop_strings="\n"), ValueError, "use stream() for stop_strings"),
        (dict(attention_mask=torch.tensor([[1, 0, 1]])), {}, ValueError, "left padding"),
        (dict(attention_mask=torch.tensor([[0, 0, 0]])), {}, ValueError, "left padding"),
        (dict(attention_mask=torch.tensor([[1, 1]])), {}, ValueError, "attention_mask must have idx's shape (1, 3)"),
    ],
)
def test_generate_refuses_bad_arguments_before_running_the_model(kwargs, fields, exc, msg):
    m = RunningMeanLM()
    with pytest.raises(exc, match=re.escape(msg)):  # a bad field fails in SamplingConfig, a bad stop id in generate
        config = {"config": SamplingConfig(**fields)} if fields else {}
        generate(m, torch.tensor([[1, 2, 3]]), 5, **kwargs, **config)
    assert m.calls == []  # refused before running the model


def test_generate_refuses_bad_prompts():
    m = RunningMeanLM()
    with pytest.raises(ValueError, match="empty prompt"):
        generate(m, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="empty prompt"):
        generate(m, torch.zeros(0, 3, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"idx\[None\]"):
        generate(m, torch.tensor([1, 2]), 3)
    with pytest.raises(TypeError, match="LongTensor"):
        generate(m, torch.tensor([[1.0, 2.0]]), 3)
    with pytest.raises(ValueError, match=re.escape("max_new_tokens must be in [0, 1000000]")):
        generate(m, torch.tensor([[1]]), -2)
    assert torch.equal(generate(m, torch.tensor([[1, 2]]), 0), torch.tensor([[1, 2]]))


@pytest.mark.parametrize("n", [10**9, 10**21])
def test_an_absurd_max_new_tokens_is_refused_at_once(n):
    "W30: `--max-new-tokens 1000000000` (or 10**21) ran without end or output; now one line, before any work."
    m = RunningMeanLM()
    for call in [
        lambda: generate(m, torch.tensor([[1]]), n),
        lambda: stream(m, CharTokenizer.train("ab"), "ab", n),
        lambda: generate_steps(m, torch.tensor([[1]]), n),
    ]:
        with pytest.raises(OptionError, match=re.escape("max_new_tokens must be in [0, 1000000]")) as e:
            call()
        assert e.value.field == "max_new_tokens" and m.calls == []


def test_generate_over_1500_tokens_gives_the_tokens_of_generate_steps():
    "Batched generate collects each step's tokens and picks each row's: a long run equals the steps, token for token."
    m = RunningMeanLM()
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
    n = 1500
    out = generate(m, idx, n, temperature=0)
    steps = torch.stack([tok for tok, _ in generate_steps(m, idx, n, temperature=0)], dim=1)
    assert out.shape == (2, 3 + n)
    assert torch.equal(out[:, 3:], steps)


def test_the_loop_copies_only_the_window_the_model_sees(monkeypatch):
    "W30: appending each token to the whole text made long generations quadratic; the loop keeps max_seq_len."
    widest, real_cat = [0], torch.cat

    def cat(tensors, *args, **kw):
        out = real_cat(tensors, *args, **kw)
        widest[0] = max(widest[0], out.size(-1))
        return out

    monkeypatch.setattr(torch, "cat", cat)
    m = RunningMeanLM(max_seq_len=12)
    cfg = SamplingConfig(max_new_tokens=300, temperature=0, repetition_penalty=1.2)
    steps = list(generate_steps(m, torch.tensor([[1, 2, 3]]), config=cfg))
    assert len(steps) == 300 and widest[0] == 13  # the window and the new token, never the text (303 tokens)


# ---------------------------------------------------------------- UTF-8 streaming


def _split(data, cuts):
    cuts = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


def _teaching_decoder():
    "The chapter's hand-written Utf8Decoder: a teaching cell, not exported, so it is run from the notebook."
    nb = json.loads((Path(__file__).parents[1] / "nbs" / "09_sampling.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "".join(c["source"]).startswith("def utf8_incomplete_tail"))
    space = {}
    exec("".join(cell["source"]), space)
    return space["Utf8Decoder"], space["utf8_incomplete_tail"]


Utf8Decoder, utf8_incomplete_tail = _teaching_decoder()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.lists(st.integers(0, 1000), max_size=12))
def test_teaching_utf8_decoder_equals_the_codecs_decoder_on_random_bytes(data, cuts):
    chunks = _split(data, cuts)
    ours, stdlib = Utf8Decoder(), codecs.getincrementaldecoder("utf-8")(errors="replace")
    want = [stdlib.decode(c) for c in chunks] + [stdlib.decode(b"", final=True)]
    assert "".join(ours.feed(c) for c in chunks) + ours.flush() == "".join(want)
    assert "".join(want) == data.decode("utf-8", errors="replace")


@SETTINGS
@given(st.text(max_size=30), st.lists(st.integers(0, 1000), max_size=12))
def test_teaching_utf8_decoder_gives_the_same_pieces_on_valid_text(text, cuts):
    "On valid UTF-8 every chunk's piece is the same (on invalid bytes codecs may show U+FFFD a chunk earlier)."
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        return  # lone surrogates have no UTF-8 encoding
    chunks = _split(text.encode("utf-8"), cuts)
    ours, stdlib = Utf8Decoder(), codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = [ours.feed(c) for c in chunks]
    assert pieces == [stdlib.decode(c) for c in chunks]
    assert "".join(pieces) == text
    assert ours.flush() == ""


def test_utf8_incomplete_tail_examples():
    assert utf8_incomplete_tail(b"") == 0
    assert utf8_incomplete_tail(b"abc") == 0
    assert utf8_incomplete_tail("é".encode()[:1]) == 1
    assert utf8_incomplete_tail("€".encode()[:2]) == 2
    assert utf8_incomplete_tail("😉".encode()[:3]) == 3
    assert utf8_incomplete_tail("😉".encode()) == 0
    assert utf8_incomplete_tail(b"\xff") == 0  # never valid: nothing to wait for


def ByteTok():
    "A BPETokenizer with no merges: every byte is one token."
    return BPETokenizer([])


def test_stream_joins_to_the_decoded_generate_output():
    m = RunningMeanLM(vocab_size=256, max_seq_len=16)
    tok = ByteTok()
    prompt = "héllo"
    pieces = list(stream(m, tok, prompt, 40, temperature=1.0, generator=torch.Generator().manual_seed(0)))
    out = generate(m, torch.tensor([tok.encode(prompt)]), 40, generator=torch.Generator().manual_seed(0))
    assert "".join(pieces) == tok.decode(out[0, len(tok.encode(prompt)) :].tolist())
    assert all(pieces)


def test_stream_stops_without_printing_the_stop_token():
    text = "abcdefghijklmnopqrstuvw"
    tok = CharTokenizer.train(text)
    m = RunningMeanLM(vocab_size=tok.vocab_size)
    full = generate(m, torch.tensor([tok.encode("abc")]), 30, temperature=0)[0, 3:].tolist()
    stop = full[4]
    got = "".join(stream(m, tok, "abc", config=SamplingConfig(max_new_tokens=30, temperature=0, stop=stop)))
    assert got == tok.decode(full[: full.index(stop)])
    with pytest.raises(ValueError, match="empty prompt"):
        stream(m, tok, "", 5)
    with pytest.raises(ValueError, match="'Z'"):
        stream(m, tok, "abZ", 5)  # unknown to the char tokenizer
    with pytest.raises(ValueError, match="top_p must be in"):
        stream(m, tok, "ab", 5, top_p=0)


NEVER = "☃☃☃"  # nine bytes that a 40-byte random sample will not contain


def first_stop_cut(text: str, stops) -> str:
    "The reference: the shortest start of `text` that holds a stop string, cut before its first stop string."
    for n in range(len(text) + 1):
        if hits := [i for s in stops if (i := text[:n].find(s)) >= 0]:
            return text[: min(hits)]
    return text


@SETTINGS
@given(st.integers(0, 2**31), st.integers(0, 50), st.integers(1, 4), st.integers(0, 50))
def test_stream_stop_strings_cut_just_before_the_first_occurrence(seed, at, width, at2):
    m = RunningMeanLM(vocab_size=256, max_seq_len=16)
    tok = ByteTok()

    def run(**kw):
        cfg = SamplingConfig(max_new_tokens=40, **kw)
        return list(stream(m, tok, "héllo", config=cfg, generator=torch.Generator().manual_seed(seed)))

    text = "".join(run())
    assert "".join(run(stop_strings=NEVER)) == text
    cut, other = text[at : at + width] or NEVER, text[at2 : at2 + 2] or NEVER  # often overlapping, often U+FFFD
    pieces = run(stop_strings=[cut, other])
    assert "".join(pieces) == first_stop_cut(text, [cut, other])
    assert all(pieces)


def forced_bytes(data: bytes, stops, prompt="a"):
    "The pieces `stream` yields when the model is forced to write `data` one byte per token."
    model = ForcedLM(list(data), len(prompt.encode()), 256)
    cfg = SamplingConfig(max_new_tokens=len(data), temperature=0, use_cache=False, stop_strings=stops)
    return list(stream(model, ByteTok(), prompt, config=cfg))


@pytest.mark.parametrize(
    "data, stops, want",
    [
        # Found by hypothesis: '\ufffd7' is complete one character before 'W\ufffd7\ufffd' would be, so the
        # stream ends there; the 'W' before it is text, not the start of a stop string that finished.
        (b"\x16\xcfW\xd47\xcfz", ("W\ufffd7\ufffd", "\ufffd7"), "\x16\ufffdW"),
        # The decoder hands over '\ufffdW' at once; 'b\ufffd' ends first, so the cut is before its 'b', as if
        # the characters had come one at a time (it used to cut before 'ab\ufffdW', one character too early).
        (b"ab\xcfWc", ("ab\ufffdW", "b\ufffd"), "a"),
        (b"ab\xcfWc", ("\ufffd",), "ab"),  # the replacement character itself as a stop string
        (b"ab\xcf", ("\ufffd",), "ab"),  # ... made only by the final flush
        (b"\xcf\xcf\xcfx", ("\ufffd\ufffd",), ""),
    ],
)
def test_stream_stop_strings_on_invalid_utf8(data, stops, want):
    "Nothing at or after the first complete stop string is ever yielded, however the decoder groups characters."
    pieces = forced_bytes(data, stops)
    assert "".join(pieces) == want == first_stop_cut(data.decode("utf-8", errors="replace"), stops)
    assert all(pieces)


def test_stream_stop_strings_do_not_depend_on_how_characters_arrive():
    "The same text, one character per token (a CharTokenizer) or one byte per token (U+FFFD glued to the next)."
    data = b"ab\xcfWc\xd47\xcfz"
    text = data.decode("utf-8", errors="replace")
    tok = CharTokenizer.train(text)
    for stops in [("ab\ufffdW", "b\ufffd"), ("W\ufffd7\ufffd", "\ufffd7"), ("c\ufffd7\ufffdz", "7")]:
        model = ForcedLM(tok.encode(text), 1, tok.vocab_size)
        cfg = SamplingConfig(max_new_tokens=len(text), temperature=0, use_cache=False, stop_strings=stops)
        by_char = "".join(stream(model, tok, "a", config=cfg))
        assert "".join(forced_bytes(data, stops)) == by_char == first_stop_cut(text, stops), stops


def test_stream_holds_back_only_a_possible_stop_string():
    tok = CharTokenizer.train("abcdefghijklmnopqrstuvw\n")
    m = RunningMeanLM(vocab_size=tok.vocab_size)
    text = "".join(stream(m, tok, "abc", 30, temperature=0))
    stop = text[6:9]  # three characters: the stream holds back at most two at a time
    pieces = list(stream(m, tok, "abc", config=SamplingConfig(max_new_tokens=30, temperature=0, stop_strings=stop)))
    assert "".join(pieces) == text[: text.index(stop)]


# ---------------------------------------------------------------- SamplingConfig: one source, checked once per call


def test_sampling_config_fields_and_defaults():
    "The fields `gptbook sample` makes its flags from: pinned, since the CLI and the docs name them."
    assert SamplingConfig().to_dict() == dict(
        max_new_tokens=500,
        temperature=1.0,
        top_k=None,
        top_p=None,
        min_p=None,
        repetition_penalty=None,
        stop=None,
        stop_strings=None,
        use_cache=True,
        threads=None,
    )
    for f in dataclasses.fields(SamplingConfig):
        help_ = f.metadata["help"]
        assert help_ and "\n" not in help_ and len(help_) <= 90, f.name


def test_sampling_config_normalises_and_checks_stop():
    assert SamplingConfig(stop=3).stop == (3,)
    assert SamplingConfig(stop=[4, 5]).stop == (4, 5)
    assert SamplingConfig(stop=torch.tensor([6, 7])).stop == (6, 7)
    assert SamplingConfig(stop_strings="\n\n").stop_strings == ("\n\n",)
    with pytest.raises(OptionError, match="stop_strings must be a non-empty string"):
        SamplingConfig(stop_strings=["a", ""])
    with pytest.raises(OptionError, match="stop_strings must be a non-empty string, got 3"):
        SamplingConfig(stop_strings=("a", 3))
    with pytest.raises(OptionError, match="use_cache must be true or false, got 1"):
        SamplingConfig(use_cache=1)
    cfg = SamplingConfig(temperature=0.7, stop=[1, 2], stop_strings="x")
    assert SamplingConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(OptionError, match="unknown SamplingConfig field.s. temprature"):
        SamplingConfig.from_dict({"temprature": 0.5})
    assert cfg.replace(top_k=3).top_k == 3
    assert cfg.top_k is None
    with pytest.raises(OptionError, match="top_k must be at least 1"):
        cfg.replace(top_k=0)


def test_settings_come_as_keywords_or_as_a_config_not_both():
    m = RunningMeanLM()
    idx = torch.randint(23, (2, 3), generator=torch.Generator().manual_seed(7))

    def run(*args, **kw):
        return generate(m, idx, *args, generator=torch.Generator().manual_seed(0), **kw)

    cfg = SamplingConfig(max_new_tokens=12, temperature=2.0, top_k=3)
    assert torch.equal(run(config=cfg), run(12, temperature=2.0, top_k=3))
    assert torch.equal(run(4, config=cfg), run(config=cfg)[:, : 3 + 4])  # max_new_tokens may go beside a config
    assert not torch.equal(run(config=cfg), run(config=cfg.replace(top_k=None)))
    for keyword in [dict(temperature=0), dict(top_k=1), dict(top_p=0.5), dict(use_cache=False)]:
        name = next(iter(keyword))
        with pytest.raises(TypeError, match=f"{name} was given both as a keyword and in config"):
            run(config=cfg, **keyword)
    steps = list(generate_steps(m, idx, 3, config=cfg.replace(temperature=0)))
    assert len(steps) == 3
    assert run().shape == (2, 3 + SamplingConfig().max_new_tokens)  # no length and no config: the config's default


def test_the_contract_positional_order():
    m = RunningMeanLM()
    idx = torch.tensor([[1, 2, 3]])
    positional = generate(m, idx, 10, 0.9, 5, 0.8, False, generator=torch.Generator().manual_seed(1))
    assert m.calls[-1] == (12, False)  # use_cache=False reached the loop: no cache, the whole window
    named = generate(
        m, idx, max_new_tokens=10, temperature=0.9, top_k=5, top_p=0.8, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(positional, named)
    assert positional.shape == (1, 13)


@pytest.mark.parametrize("fn", [generate, generate_steps, stream])
def test_the_five_keywords_then_config_and_generator(fn):
    "The contract's five keywords in order, with SamplingConfig's defaults (max_new_tokens None: the config's)."
    params = inspect.signature(fn).parameters
    names = list(params)
    first = names.index("max_new_tokens")
    five = ["max_new_tokens", "temperature", "top_k", "top_p", "use_cache"]
    assert names[first:] == [*five, "config", "generator"] + (["attention_mask"] if fn is generate else [])
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names[first + 5 :])
    defaults = SamplingConfig()
    assert params["max_new_tokens"].default is None
    assert all(params[n].default == getattr(defaults, n) for n in five[1:])


def test_settings_are_checked_once_per_call_not_per_token(monkeypatch):
    checked = []
    real = gptbook.options.check_value

    def counting(name, *args):
        checked.append(name)
        return real(name, *args)

    monkeypatch.setattr(gptbook.options, "check_value", counting)
    m = RunningMeanLM(vocab_size=256)
    cfg = SamplingConfig(temperature=0.9, top_k=50, top_p=0.95, min_p=0.01, repetition_penalty=1.1)
    counts = []
    for n in [2, 40]:
        checked.clear()
        out = generate(m, torch.tensor([[1, 2, 3]]), n, config=cfg, generator=torch.Generator().manual_seed(0))
        assert out.shape == (1, 3 + n)
        counts.append(len(checked))
        checked.clear()
        "".join(stream(m, ByteTok(), "abc", n, config=cfg, generator=torch.Generator().manual_seed(0)))
        counts.append(len(checked))
    assert counts[0] == counts[2] and counts[1] == counts[3], counts
    assert counts[0] >= len(dataclasses.fields(SamplingConfig))  # the config itself was checked, once per call


# ---------------------------------------------------------------- the real GPT: cache == plain loop

from gptbook.model import GPT, GPTConfig  # noqa: E402

_SMALL = dict(vocab_size=61, max_seq_len=16, n_layers=2, n_heads=4, d_model=32)
GPT_VARIANTS = {
    "learned": GPTConfig(**_SMALL, positions="learned"),
    "sinusoidal": GPTConfig(**_SMALL, positions="sinusoidal"),
    "rope": GPTConfig(**_SMALL, positions="rope"),
    "rope-gqa": GPTConfig(**_SMALL, positions="rope", n_kv_heads=2),
    "llama-mqa": GPTConfig.llama_style(**_SMALL, n_kv_heads=1),
    "learned-gqa-post-norm-manual": GPTConfig(**_SMALL, n_kv_heads=2, norm_position="post", use_sdpa=False),
}


def _random_gpt(cfg, seed=0):
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    with torch.no_grad():  # larger weights than the init, so that greedy does not just repeat one token
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8)
    return model


@pytest.mark.parametrize("name", GPT_VARIANTS)
def test_gpt_cache_equals_plain_loop_past_max_seq_len(name):
    model = _random_gpt(GPT_VARIANTS[name])
    idx = torch.randint(61, (2, 5), generator=torch.Generator().manual_seed(1))
    for kw in [dict(temperature=0), dict(temperature=1.0)]:  # greedy, and sampling for varied tokens
        fast = list(generate_steps(model, idx, 40, **kw, generator=torch.Generator().manual_seed(0)))  # 45 > 16
        slow = list(generate_steps(model, idx, 40, **kw, use_cache=False, generator=torch.Generator().manual_seed(0)))
        for step, ((t1, z1), (t2, z2)) in enumerate(zip(fast, slow)):
            assert torch.equal(t1, t2), (name, kw, step)
            torch.testing.assert_close(z1, z2, rtol=1e-4, atol=1e-4)
    toks = torch.stack([t for t, _ in fast], 1)
    assert len(set(toks[0].tolist())) > 5, "degenerate test: the sampled text repeats a few tokens"
    with torch.no_grad():  # and greedy agrees with an independent plain loop
        want = plain_loop(model, idx, 40, lambda z, _: z.argmax(-1))
    assert torch.equal(generate(model, idx, 40, temperature=0), want)


def test_prompt_ids_outside_the_vocabulary_are_one_line_from_the_model():
    model = _random_gpt(GPT_VARIANTS["learned"])
    with pytest.raises(ValueError, match=r"token id 61 in idx is outside the vocabulary 0..60 \(vocab_size=61\)"):
        generate(model, torch.tensor([[1, 61]]), 3)
    with pytest.raises(OptionError, match=r"stop token id 99 .*\(vocab_size=61\)"):
        generate(model, torch.tensor([[1]]), config=SamplingConfig(max_new_tokens=3, stop=99))


def test_gpt_cache_sampling_is_reproducible_and_equals_no_cache():
    model = _random_gpt(GPT_VARIANTS["rope-gqa"])
    idx = torch.randint(61, (3, 4), generator=torch.Generator().manual_seed(2))

    def run(use_cache, seed):
        g = torch.Generator().manual_seed(seed)
        return generate(model, idx, 30, temperature=0.9, top_p=0.95, generator=g, use_cache=use_cache)

    a = run(True, 3)
    assert torch.equal(a, run(True, 3))
    assert torch.equal(a, run(False, 3))  # same probabilities to ~1e-6, same draws
    assert not torch.equal(a, run(True, 4))


@pytest.mark.parametrize("name", ["learned", "rope-gqa"])
def test_gpt_ragged_batch_equals_one_by_one(name):
    model = _random_gpt(GPT_VARIANTS[name])
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(61, (n,), generator=g).tolist() for n in [3, 9, 1, 20]]  # 20 > max_seq_len
    idx, mask = pad_prompts(prompts)
    out = generate(model, idx, 12, temperature=0, attention_mask=mask)
    for i, p in enumerate(prompts):
        alone = generate(model, torch.tensor([p]), 12, temperature=0)
        assert torch.equal(out[i, 20 - len(p) :], alone[0]), i


def test_stream_with_a_bpe_tokenizer_joins_to_the_decoded_output():
    tokmod = pytest.importorskip("gptbook.tokenizer")
    if not hasattr(tokmod, "BPETokenizer"):
        pytest.skip("BPETokenizer not written yet")
    text = "naïve café 안녕하세요 😉 " * 20 + "hello world"
    tok = tokmod.BPETokenizer.train(text, 300)
    ids = tok.encode("안녕하세요 😉")
    # a multi-byte character really is split across tokens in this vocabulary, or the test proves nothing
    assert any(
        tok.vocab[i].decode("utf-8", errors="replace") != tok.vocab[i].decode("utf-8", errors="ignore")
        for i in range(tok.vocab_size)
    )
    model = _random_gpt(GPTConfig(vocab_size=tok.vocab_size, max_seq_len=32, n_layers=1, n_heads=2, d_model=16))
    for seed in range(3):
        pieces = list(stream(model, tok, "café", 50, generator=torch.Generator().manual_seed(seed)))
        out = generate(model, torch.tensor([tok.encode("café")]), 50, generator=torch.Generator().manual_seed(seed))
        assert "".join(pieces) == tok.decode(out[0, len(tok.encode("café")) :].tolist())
    assert ids


# ---------------------------------------------------------------- stream with every kind of tokenizer
TARGET = "日🙂 naïve"


class ForcedLM(nn.Module):
    "A stand-in whose greedy next token is `script[k]` at the k-th new position: the output ids are forced."

    def __init__(self, script, prompt_len: int, vocab_size: int):
        super().__init__()
        self.script, self.prompt_len = list(script), prompt_len
        self.config = _Cfg(vocab_size, max_seq_len=1024)

    def forward(self, idx, cache=None):
        B, T = idx.shape
        logits = torch.zeros(B, T, self.config.vocab_size)
        k = T - self.prompt_len  # how many new tokens the sequence holds already
        logits[:, -1, self.script[min(k, len(self.script) - 1)]] = 1.0
        return logits


def streamed(tok, ids, prompt="a"):
    n_prompt = len(as_tokenizer(tok).encode(prompt))
    model = ForcedLM(ids, n_prompt, as_tokenizer(tok).vocab_size)
    pieces = list(stream(model, tok, prompt, len(ids), temperature=0, use_cache=False))
    return pieces


def byte_fallback_hf():
    "A SentencePiece-style HF tokenizer (not byte-level): characters, and <0xNN> byte tokens for the rest."
    from tokenizers import Tokenizer, decoders, models

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    vocab.update({c: 256 + i for i, c in enumerate(sorted(set(TARGET + "a") - {"🙂"}))})
    hf = Tokenizer(models.BPE(vocab, [], byte_fallback=True))
    hf.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return hf


def tokenizer_kinds():
    "(name, tokenizer, forced ids that spell TARGET with its multi-byte characters cut into bytes where it can)."
    pytest.importorskip("tiktoken")
    pytest.importorskip("tokenizers")
    from gptbook.tokenizer import GPT2_PATTERN, BPETokenizer, CharTokenizer

    bpe = BPETokenizer.train("naïve naïve 日日 🙂🙂 " * 20, 270, GPT2_PATTERN)
    byte_ids = list(TARGET.encode("utf-8"))  # every character cut into its bytes
    mixed = bpe.encode(TARGET[:2]) + byte_ids[len(TARGET[:2].encode()) :]
    char = CharTokenizer.train(TARGET + "a")
    fallback = byte_fallback_hf()
    fallback_ids = [fallback.token_to_id(c) for c in "日"] + list("🙂".encode()) + fallback.encode(" naïve").ids
    kinds = [
        ("bpe", bpe, byte_ids),
        ("bpe-merged", bpe, mixed),
        ("char", char, char.encode(TARGET)),
        ("tiktoken", bpe.to_tiktoken(), byte_ids),
        ("tokenizers", bpe.to_hf(), byte_ids),
        ("tokenizers-fallback", fallback, fallback_ids),
    ]
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return kinds
    return [*kinds, ("transformers", PreTrainedTokenizerFast(tokenizer_object=bpe.to_hf()), byte_ids)]


def test_stream_gives_the_exact_text_with_every_tokenizer_kind():
    for name, tok, ids in tokenizer_kinds():
        for t in (tok, as_tokenizer(tok)):
            pieces = streamed(t, ids)
            assert "".join(pieces) == TARGET, (name, pieces)
            assert all(pieces) and "\ufffd" not in "".join(pieces), name  # no half character ever shown
        adapted = as_tokenizer(tok)
        if isinstance(adapted, TokenizerAdapter):  # byte-level ones stream by bytes; the fallback one by prefix diffs
            assert (adapted.token_bytes(ids[0]) is None) == (name == "tokenizers-fallback"), name


def test_text_decoder_prefix_diff_holds_back_half_characters():
    from gptbook.sample import TextDecoder

    hf = as_tokenizer(byte_fallback_hf())
    dec = TextDecoder(hf)
    got = [dec.add(i) for i in list("🙂".encode())] + [dec.flush()]
    assert got == ["", "", "", "🙂", ""]
    dec = TextDecoder(hf)
    assert [dec.add(0xF0), dec.flush()] == ["", "\ufffd"]  # an unfinished last character shows as U+FFFD at the end


# ---------------------------------------------------------------- CPU threads (issue 26, F1)


def test_sampling_runs_on_one_thread_unless_asked_and_gives_the_count_back():
    "F1: two threads beside a busy job made `gptbook sample` 16x slower; sampling takes 1 unless threads=N."
    from gptbook.model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=20, max_seq_len=8, n_layers=1, n_heads=2, d_model=16)).eval()
    idx = torch.zeros(1, 1, dtype=torch.long)
    torch.set_num_threads(3)  # the caller's count (the one_thread fixture restores its own after the test)
    for config, during in [(SamplingConfig(max_new_tokens=4), 1), (SamplingConfig(max_new_tokens=4, threads=2), 2)]:
        seen = [torch.get_num_threads() for _ in generate_steps(model, idx, config=config)]
        assert seen == [during] * 4
        assert torch.get_num_threads() == 3
    steps = generate_steps(model, idx, 4)
    next(steps)
    steps.close()  # a loop left early gives the count back too
    assert torch.get_num_threads() == 3
    generate(model, idx, 3)
    assert torch.get_num_threads() == 3
    with pytest.raises(OptionError, match="threads"):
        SamplingConfig(threads=-1)
