"""gptbook.faster (chapter 15): Muon against torch.optim.Muon and torch.optim.AdamW, its groups, resume with Muon,
the speedrun preset end to end (a short smoke run; the real run is bench/speedrun.py), the speed line."""

import json
import re

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gptbook.config import GPTConfig
from gptbook.data import load_token_data
from gptbook.faster import SPEEDRUN, Muon, matmul_flops, muon_groups, newton_schulz
from gptbook.model import GPT
from gptbook.train import TrainConfig, make_optimizer, train

from test_cli import call, run_cli
from test_train import new_trainer, tiny_cfg, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def chars(shakespeare):
    return load_token_data("char")


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 40), nesterov_steps=st.integers(1, 4), seed=st.integers(0, 99))
def test_muon_equals_torch_optim_muon_bit_for_bit(rows, cols, nesterov_steps, seed):
    "Tall, wide and square matrices, with weight decay: the same weights as the library's Muon after each step."
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g)
    ours, theirs = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    mine = Muon([{"params": [ours]}], lr=0.03, momentum=0.9, weight_decay=0.1)
    lib = torch.optim.Muon([theirs], lr=0.03, momentum=0.9, weight_decay=0.1)
    for _ in range(nesterov_steps):
        grad = torch.randn(rows, cols, generator=g)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        mine.step()
        lib.step()
        assert torch.equal(ours, theirs)


def test_the_adamw_groups_follow_torch_optim_adamw():
    "Muon's AdamW groups (embeddings, head, gains) against torch.optim.AdamW, weight decay and bias correction on."
    g = torch.Generator().manual_seed(0)
    w = torch.randn(7, 5, generator=g)
    ours, theirs = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    mine = Muon([{"params": [ours], "muon": False, "lr": 1e-2, "weight_decay": 0.1}])
    lib = torch.optim.AdamW([theirs], lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    for _ in range(10):
        grad = torch.randn(7, 5, generator=g)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        mine.step()
        lib.step()
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)  # float32 rounding: the operations' order differs


@pytest.mark.parametrize("overrides", [{}, {"tie_weights": False}, {"ffn": "swiglu", "bias": False, "n_kv_heads": 2}])
def test_muon_groups_hold_every_parameter_once_and_only_the_blocks_matrices_in_muon(overrides):
    model = GPT(GPTConfig.baby(65, **overrides))
    matrices, rest = muon_groups(model, lr=1e-3, muon_lr=0.02)
    listed = [id(p) for p in matrices["params"] + rest["params"]]
    assert sorted(listed) == sorted(id(p) for p in model.parameters())  # each tensor once (a tied head too)
    named = {id(p): n for n, p in model.named_parameters()}
    assert all(named[id(p)].startswith("blocks.") and p.ndim == 2 for p in matrices["params"])
    assert {named[id(p)] for p in rest["params"]} >= {"wte.weight"} | (
        {"lm_head.weight"} if not model.config.tie_weights else set()
    )
    assert matrices["lr_scale"] == pytest.approx(20) and rest["muon"] is False


def test_newton_schulz_orthogonalizes():
    "Singular values over 2 decades pushed into the quintic's band around 1, whatever the scale of G; zero stays zero."
    G = torch.randn(64, 16) @ torch.diag(torch.logspace(-2, 0, 16)) * 1e3  # over 2 decades, any scale
    s = torch.linalg.svdvals(newton_schulz(G).float())
    assert 0.6 < s.min() and s.max() < 1.25, s
    assert torch.equal(newton_schulz(torch.zeros(3, 4)).float(), torch.zeros(3, 4))


def test_the_trainer_steps_muon_at_the_scaled_rate(chars, tmp_path):
    "Muon's group gets muon_lr times the schedule; AdamW's the schedule itself."
    cfg = tiny_cfg(tmp_path, optimizer="muon", muon_lr=0.05, lr=2e-3, max_iters=4)
    trainer = new_trainer(chars, cfg, tiny_config())
    assert isinstance(trainer.optimizer, Muon)
    stats = trainer.train_step()
    matrices, rest = trainer.optimizer.param_groups
    assert rest["lr"] == stats["lr"] and matrices["lr"] == pytest.approx(stats["lr"] * 25)


def test_resume_with_muon_is_bit_exact(chars, tmp_path):
    "Muon's momentum buffers and its AdamW moments survive a checkpoint: k + resume + (N - k) == N straight."
    cfg = dict(max_iters=12, eval_interval=6, optimizer="muon")
    straight = new_trainer(chars, tiny_cfg(tmp_path / "straight", **cfg), tiny_config())
    straight.fit()
    first = new_trainer(chars, tiny_cfg(tmp_path / "resumed", **cfg), tiny_config())
    first.fit(stop_at=6)
    rest = train(tiny_cfg(tmp_path / "resumed", **cfg), resume=True, data=chars)
    for (name, p), q in zip(straight.model.state_dict().items(), rest.model.state_dict().values()):
        assert torch.equal(p, q), name
    a, b = straight.optimizer.state_dict()["state"], rest.optimizer.state_dict()["state"]
    assert a.keys() == b.keys() and all(
        torch.equal(v, b[i][k]) if torch.is_tensor(v) else v == b[i][k] for i, s in a.items() for k, v in s.items()
    )


def test_make_optimizer_picks_adamw_unless_muon_is_asked_for():
    model = GPT(tiny_config())
    assert type(make_optimizer(model)) is torch.optim.AdamW
    assert type(make_optimizer(model, muon_lr=0.02)) is Muon


def test_the_speedrun_preset_is_the_baby_with_rope_and_the_recipe():
    cfg = TrainConfig.from_preset("speedrun", max_iters=10)
    assert cfg.preset == "speedrun" and cfg.max_iters == 10  # an override wins over the preset
    assert {k: getattr(cfg, k) for k in SPEEDRUN if k != "max_iters"} == {
        k: v for k, v in SPEEDRUN.items() if k != "max_iters"
    }
    assert GPTConfig.from_preset("speedrun", 65) == GPTConfig.baby(65, positions="rope")
    assert TrainConfig.from_preset("baby") == TrainConfig()


def test_train_help_shows_the_presets_own_defaults(capsys):
    _, out, _ = call(capsys, "train", "--preset", "speedrun", "--help")
    flat = " ".join(out.split())
    assert f"(default: {SPEEDRUN['max_iters']})" in flat and "(default: muon)" in flat


def test_speedrun_preset_smoke_run(tmp_path, shakespeare_path):
    "The real command, a few steps: Muon in the config it saves, the speed line at the end, flags over the preset."
    out = tmp_path / "run"
    r = run_cli("train", "--preset", "speedrun", "--max-iters", 8, "--eval-interval", 4, "--eval-iters", 2,
                "--out", out, "--sample-tokens", 20, "--threads", 1, "--no-progress")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    saved = json.loads((out / "config.json").read_text())["train_config"]
    assert saved["optimizer"] == "muon" and saved["max_iters"] == 8 and saved["lr"] == SPEEDRUN["lr"]
    speed = re.search(
        r"^speed: ([\d.]+) GFLOP/s in the model's matmuls, (\d+)% of the ([\d.]+) GFLOP/s", r.stdout, re.M
    )
    assert speed and 0 < float(speed[1]) < float(speed[3]), r.stdout
    replay = run_cli("train", "--config", out, "--out", tmp_path / "again", "--max-iters", 4, "--sample-tokens", 0)
    assert replay.returncode == 0, replay.stderr[-3000:]  # a replay keeps the run's settings, the preset's included


def test_matmul_flops_is_a_rate_and_leaves_the_random_state_alone():
    "A run's summary measures it: the samples drawn after training must not depend on it."
    state = torch.get_rng_state()
    assert 1e8 < matmul_flops(64, seconds=0.01) < 1e14
    assert torch.equal(torch.get_rng_state(), state)
