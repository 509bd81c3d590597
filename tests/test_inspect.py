"""The instruments of chapter 14 (gptbook.inspect): recorded attention against the NumPy mirror, ablation, the
logit lens, the scores on hand-built patterns, the induction task's batches, and bench/induction.py --dry-run."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gptbook.attention import causal_mask
from gptbook.inspect import (
    AttentionOnly,
    ablate,
    attention_layers,
    circuit_test,
    induction_score,
    logit_lens,
    patch,
    phase_change_step,
    previous_token_score,
    record,
    repeat_batch,
    repeated_tokens,
    train_induction,
)
from gptbook.model import GPT, GPTConfig
from gptbook.scratch.attention import causal_mask as np_causal_mask
from gptbook.scratch.attention import softmax as np_softmax
from gptbook.scratch.embedding import params_of
from gptbook.scratch.layers import block as np_block
from gptbook.scratch.layers import layer_norm as np_layer_norm
from gptbook.scratch.layers import linear as np_linear

ROOT = Path(__file__).resolve().parents[1]


def tiny_gpt(seed=0, **overrides):
    torch.manual_seed(seed)
    config = dict(n_layers=2, n_heads=2, d_model=16, max_seq_len=12)
    return GPT(GPTConfig.baby(11, **{**config, **overrides})).eval()


def mirror_weights(params, idx, n_layers, n_heads):
    "Attention weights per block from the NumPy mirror (learned positions, pre-LayerNorm)."
    T = idx.shape[1]
    x = params["wte.weight"][idx] + params["wpe.weight"][:T]
    out = []
    for i in range(n_layers):
        p = params_of(params, f"blocks.{i}")
        h = np_layer_norm(x, p["ln_1.weight"], p["ln_1.bias"])
        q, k, _ = np.split(np_linear(h, p["attn.c_attn.weight"], p["attn.c_attn.bias"]), 3, axis=-1)
        q, k = (t.reshape(*idx.shape, n_heads, -1).transpose(0, 2, 1, 3) for t in (q, k))
        scores = q @ k.swapaxes(-1, -2) / q.shape[-1] ** 0.5
        out.append(np_softmax(np.where(np_causal_mask(T), scores, -np.inf)))
        x = np_block(p, x, n_heads)
    return out


@pytest.fixture
def model_and_ids():
    model = tiny_gpt()
    # trained-like weights: random init has near-uniform attention, which would make the checks weak
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.c_attn.weight.mul_(20)
    return model, torch.randint(11, (3, 12), generator=torch.Generator().manual_seed(1))


def test_recorded_attention_is_a_distribution_and_equals_the_numpy_mirror(model_and_ids):
    model, idx = model_and_ids
    with torch.no_grad(), record(model) as rec:
        model(idx)
    assert len(rec.attn) == 2 and rec.attn[0].shape == (3, 2, 12, 12)
    for w in rec.attn:
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 12))
        assert w.triu(diagonal=1).abs().max() == 0  # nothing attends to the future
        assert w.max() > 0.5  # not uniform: the check below compares something
    params = {k: v.numpy() for k, v in model.state_dict().items()}
    for got, want in zip(rec.attn, mirror_weights(params, idx.numpy(), 2, 2)):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5)  # float32, two implementations


def test_record_leaves_the_logits_unchanged_and_the_weights_reproduce_the_layer(model_and_ids):
    model, idx = model_and_ids
    with torch.no_grad():
        plain = model(idx)
        with record(model) as rec:
            recorded = model(idx)
        assert torch.equal(plain, recorded)
        assert len(rec.resid) == 3  # the embedding stream, then after each block
        attn = model.blocks[1].attn
        x = model.blocks[1].ln_1(rec.resid[1])
        B, T, C = x.shape
        v = attn.c_attn(x)[..., 2 * C :].view(B, T, 2, C // 2).transpose(1, 2)
        y = attn.c_proj((rec.attn[1] @ v).transpose(1, 2).reshape(B, T, C))
        torch.testing.assert_close(y, attn(x), atol=1e-6, rtol=0)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())  # hooks removed


def test_record_refuses_a_kv_cache(model_and_ids):
    model, idx = model_and_ids
    with pytest.raises(ValueError, match="without a KV cache"), torch.no_grad(), record(model):
        model(idx[:, :4], cache=model.make_cache(3))


def test_record_refuses_a_model_without_blocks():
    with pytest.raises(TypeError, match="needs a model with a `blocks` ModuleList.*got Linear"):
        with record(torch.nn.Linear(2, 2)):
            pass


def test_record_works_with_rope_and_grouped_query_attention():
    model = tiny_gpt(positions="rope", norm="rmsnorm", ffn="swiglu", n_heads=4, n_kv_heads=2)
    idx = torch.randint(11, (2, 12))
    with torch.no_grad(), record(model) as rec:
        model(idx)
        attn = model.blocks[0].attn
        x = model.blocks[0].ln_1(rec.resid[0])
        qkv = attn.c_attn(x)
        v = qkv[..., 16 + 8 :].view(2, 12, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1)  # (B, nh, T, hd)
        y = attn.c_proj((rec.attn[0] @ v).transpose(1, 2).reshape(2, 12, 16))
        cos, sin = model.wpe(x, 0)[1]
        torch.testing.assert_close(y, attn(x, rope=(cos, sin)), atol=1e-6, rtol=0)


def test_ablating_nothing_changes_nothing_bitwise(model_and_ids):
    model, idx = model_and_ids
    with torch.no_grad():
        plain = model(idx)
        with ablate(model, []):
            assert torch.equal(model(idx), plain)


def test_ablating_a_head_acts_only_through_that_head(model_and_ids):
    model, idx = model_and_ids
    with torch.no_grad():
        plain = model(idx)
        with record(model) as before:
            model(idx)
        with ablate(model, [(1, 0)]), record(model) as after:
            ablated = model(idx)
        assert (ablated - plain).abs().max() > 1e-3
        assert torch.equal(after.resid[1], before.resid[1])  # the stream entering layer 1 is untouched
        for a, b in zip(after.attn, before.attn):
            assert torch.equal(a, b)  # layer 1 still attends the same way; only its head 0's output is gone
        surgery = tiny_gpt()
        surgery.load_state_dict(model.state_dict())
        surgery.blocks[1].attn.c_proj.weight[:, :8] = 0  # head 0 of 2 (head_dim 8): features 0..7
        torch.testing.assert_close(surgery(idx), ablated, atol=1e-6, rtol=0)
        assert torch.equal(model(idx), plain)  # leaving the with restores the model


def test_record_keeps_each_heads_output_as_c_proj_receives_it(model_and_ids):
    model, idx = model_and_ids
    with torch.no_grad(), record(model) as rec:
        plain = model(idx)
    assert len(rec.heads) == 2 and rec.heads[0].shape == (3, 12, 2, 8)  # (B, T, n_heads, head_dim)
    attn, x = model.blocks[0].attn, model.blocks[0].ln_1(rec.resid[0])
    with torch.no_grad():
        v = attn.c_attn(x)[..., 32:].view(3, 12, 2, 8).transpose(1, 2)  # (B, nh, T, hd)
        torch.testing.assert_close(rec.heads[0], (rec.attn[0] @ v).transpose(1, 2), atol=1e-6, rtol=0)
        # a head patched with its own output: nothing changes, bit for bit
        with patch(model, {(1, 1): rec.heads[1][:, :, 1]}):
            assert torch.equal(model(idx), plain)
        # record sees what the projection was given: after a patch, the patched value
        with patch(model, {(0, 1): 0.5}), record(model) as patched:
            model(idx)
        assert torch.equal(patched.heads[0][:, :, 1], torch.full((3, 12, 8), 0.5))
        assert torch.equal(patched.heads[0][:, :, 0], rec.heads[0][:, :, 0])


def test_patching_a_constant_equals_moving_it_into_the_output_bias(model_and_ids):
    # an independent reference: head 1 of layer 0 outputting v everywhere is the same function as its columns of
    # c_proj.weight zeroed and c_proj.weight[:, slice] @ v added to c_proj.bias
    model, idx = model_and_ids
    v = torch.linspace(-1, 1, 8)
    with torch.no_grad():
        with patch(model, {(0, 1): v}):
            patched = model(idx)
        surgery = tiny_gpt()
        surgery.load_state_dict(model.state_dict())
        proj = surgery.blocks[0].attn.c_proj
        proj.bias += proj.weight[:, 8:16] @ v
        proj.weight[:, 8:16] = 0
        torch.testing.assert_close(surgery(idx), patched, atol=1e-5, rtol=0)
        assert (patched - model(idx)).abs().max() > 1e-3


def test_ablate_refuses_a_head_that_does_not_exist(model_and_ids):
    model, _ = model_and_ids
    with pytest.raises(ValueError, match=r"no head \(0, 2\).*2 attention layers of 2 heads"):
        with ablate(model, [(0, 2)]):
            pass


def test_logit_lens_at_the_last_layer_is_the_model(model_and_ids):
    model, idx = model_and_ids
    with torch.no_grad(), record(model) as rec:
        logits = model(idx)
        lens = logit_lens(model, rec.resid)
    assert lens.shape == (3, 3, 12, 11)
    assert torch.equal(lens[-1], logits)
    assert not torch.allclose(lens[0], logits)


def test_scores_on_hand_built_patterns():
    L, T = 8, 16
    rows = torch.arange(T)
    induction = torch.zeros(2, 1, T, T)
    induction[:, 0, rows[L:], rows[L:] - L + 1] = 1.0
    induction[:, 0, rows[:L], 0] = 1.0
    previous = torch.zeros(1, 1, T, T)
    previous[0, 0, rows[1:], rows[1:] - 1] = 1.0
    uniform = (causal_mask(T).float() / causal_mask(T).sum(-1, keepdim=True))[None, None]
    assert induction_score(induction, L).item() == 1.0
    assert induction_score(previous, L).item() == 0.0
    assert previous_token_score(previous).item() == 1.0
    assert induction_score(uniform, L).item() == pytest.approx(sum(1 / (i + 1) for i in range(L, T)) / L)
    assert induction_score(uniform, L).item() < 0.1
    with pytest.raises(ValueError, match="period=16"):
        induction_score(uniform, 16)


def test_repeat_batch_repeats_and_marks_the_predictable_targets():
    idx, targets, repeated = repeat_batch(64, 32, 64, (8, 16), torch.Generator().manual_seed(0))
    assert idx.shape == targets.shape == repeated.shape == (64, 32)
    assert torch.equal(targets[:, :-1], idx[:, 1:])
    for b in range(64):
        run = repeated[b].nonzero().flatten()
        assert 7 <= len(run) <= 15 and torch.equal(run, torch.arange(run[0], run[-1] + 1))  # one run of L - 1
        L = len(run) + 1
        assert torch.equal(targets[b, run], targets[b, run - L])  # each marked target repeats the one L back
    seq = repeated_tokens(3, 5, 10)
    assert torch.equal(seq[:, :5], seq[:, 5:])


def test_attention_only_model_trains_and_reports_its_history():
    model, history = train_induction(n_layers=2, steps=20, eval_every=10, seq_len=16, periods=(4, 6), probe_period=5)
    assert isinstance(model, AttentionOnly) and len(attention_layers(model)) == 2
    assert [h["step"] for h in history] == [0, 10, 20]
    assert len(history[0]["induction"]) == 2 and len(history[0]["induction"][1]) == 2  # [layer][head]
    assert history[-1]["repeated"] < history[0]["repeated"]
    assert phase_change_step([{"step": 0, "repeated": 4.0}, {"step": 5, "repeated": 1.0}]) == 5
    assert phase_change_step([{"step": 0, "repeated": math.log(64) / 2}]) is None


def test_circuit_test_finds_the_induction_circuit_of_a_trained_model():
    # seed 0 has its phase change at step 600 (bench/results/induction.json); 1,000 steps leave a margin for
    # another CPU's rounding, and take about 8 s on one idle core
    model, history = train_induction(n_layers=2, seed=0, steps=1000, eval_every=1000)
    assert history[-1]["repeated"] < 1.5
    result = circuit_test(model, seed=0)
    rows = {(tuple(r["head"] or ()), r["how"]): r for r in result["ablation"]}
    prev = max(range(2), key=lambda h: rows[(), "none"]["previous"][0][h])
    for how in ("zero", "mean"):
        broken = rows[(0, prev), how]
        assert broken["repeated"] > 3 and max(broken["induction"][1]) < 0.2  # no previous-token head, no induction
        assert rows[(1, 0), how]["repeated"] > 2 and rows[(1, 1), how]["repeated"] > 2
    runs = {(tuple(r["head"] or ()), r["how"]): r["loss"] for r in result["patching"]}
    clean, corrupted = runs[(), "clean"], runs[(), "corrupted"]
    assert clean < 1.5 < 4 < corrupted
    assert runs[(0, prev), "zeroed on the first copy"] > 3 > 1.5 > runs[(0, prev), "zeroed on the second copy"]
    for head in (0, 1):
        assert runs[(1, head), "zeroed on the first copy"] == clean  # layer 1 reaches only its own positions
        assert clean < runs[(1, head), "patched into corrupted"] < corrupted  # restores part of the gap


def test_bench_induction_dry_run(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "induction.py"), "--dry-run", "--jobs", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads((tmp_path / "induction.json").read_text())
    assert {(run["n_layers"], run["seed"]) for run in result["runs"]} == {(2, 0), (1, 0)}
    assert result["setup"]["steps"] == 30 and len(result["runs"][0]["history"]) == 4
    two = next(run for run in result["runs"] if run["n_layers"] == 2)
    assert len(two["circuit"]["ablation"]) == 1 + 2 * 4 and len(two["circuit"]["patching"]) == 2 + 3 * 4


def test_saved_induction_results_show_the_phase_change_in_two_layers_only():
    result = json.loads((ROOT / "bench" / "results" / "induction.json").read_text())
    two = [r for r in result["runs"] if r["n_layers"] == 2]
    one = [r for r in result["runs"] if r["n_layers"] == 1]
    assert len(two) >= 3 and len(one) >= 3
    assert all(r["phase_step"] is not None for r in two)
    assert all(r["phase_step"] is None for r in one)
    for r in two:
        end = r["history"][-1]
        assert max(end["previous"][0]) > 0.5 and max(end["induction"][1]) > 0.5
        intact, *ablated = r["circuit"]["ablation"]
        prev = max(range(2), key=lambda h: intact["previous"][0][h])
        broken = next(a for a in ablated if a["head"] == [0, prev] and a["how"] == "zero")
        assert intact["repeated"] < 1.5 and broken["repeated"] > 3 and max(broken["induction"][1]) < 0.2
