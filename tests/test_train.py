"""gptbook.train and the token data of gptbook.data: schedule, AdamW groups, batches, the run config,
bit-exact resume, NaN handling, metrics. The checkpoint format itself: tests/test_checkpoint.py."""

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings, strategies as st

from gptbook.checkpoint import list_checkpoints, load_checkpoint, read_state
from gptbook.data import get_batch, load_token_data, load_tokens, save_tokens
from gptbook.config import PRESETS
from gptbook.model import GPT, GPTConfig, lm_loss
from gptbook.options import OptionError, choices_of, field_types
from gptbook.tokenizer import CharTokenizer
from gptbook.train import (
    Ranks,
    Trainer,
    TrainConfig,
    TrainingDiverged,
    init_distributed,
    lr_at,
    make_optimizer,
    param_groups,
    train,
)
from gptbook.runs import load_run_config, read_metrics, save_run_config

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def chars(shakespeare):
    return load_token_data("char")


def tiny_config(vocab_size=65, **kw):
    "A one-layer model: enough to exercise every code path in milliseconds."
    return dataclasses.replace(
        GPTConfig.baby(vocab_size), **{"n_layers": 1, "n_heads": 2, "d_model": 32, "max_seq_len": 16, **kw}
    )


def tiny_cfg(out_dir, **kw):
    return TrainConfig(
        **{
            "out_dir": str(out_dir),
            "progress": False,
            "warmup_iters": 3,
            "lr": 3e-3,
            "batch_size": 4,
            "eval_iters": 2,
            "eval_interval": 5,
            "max_iters": 20,
            "threads": 1,  # what the one_thread fixture set; no probe of the machine's load
            **kw,
        }
    )


def new_trainer(data, cfg, config, seed=None):
    "Build a Trainer the way `train` does (same seeding), without running it."
    torch.manual_seed(cfg.seed if seed is None else seed)
    model = GPT(config)
    torch.manual_seed(cfg.seed)
    return Trainer(model, data, cfg)


# --- token data --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 300), B=st.integers(1, 6), T=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_get_batch_windows(n, B, T, seed):
    "Each row of x is a window of the data, y is the same window one position later; too-short data raises."
    data = np.random.default_rng(seed).integers(0, 500, n).astype(np.uint16)
    g = torch.Generator().manual_seed(seed)
    if n < T + 1:
        with pytest.raises(ValueError, match="context_len"):
            get_batch(data, B, T, g)
        return
    x, y = get_batch(data, B, T, g)
    assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
    for row_x, row_y in zip(x.numpy(), y.numpy()):
        starts = [
            s for s in range(n - T) if (data[s : s + T] == row_x).all() and (data[s + 1 : s + T + 1] == row_y).all()
        ]
        assert starts, "a row is not a window of the data"


@settings(max_examples=25, deadline=None)
@given(world=st.integers(1, 4), B=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_get_batch_ranks_partition_the_global_batch(world, B, seed):
    data = np.arange(1000, dtype=np.uint16)
    full = get_batch(data, world * B, 8, torch.Generator().manual_seed(seed))[0]
    parts = [
        get_batch(data, B, 8, torch.Generator().manual_seed(seed), rank=r, world_size=world)[0] for r in range(world)
    ]
    assert torch.equal(torch.cat(parts), full)


def test_get_batch_is_reproducible():
    data = np.arange(500, dtype=np.uint16)
    a = get_batch(data, 4, 8, torch.Generator().manual_seed(3))[0]
    b = get_batch(data, 4, 8, torch.Generator().manual_seed(3))[0]
    c = get_batch(data, 4, 8, torch.Generator().manual_seed(4))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_tokens_file_roundtrip(tmp_path):
    ids = np.random.default_rng(0).integers(0, 2**16, 1001)
    p = save_tokens(ids, tmp_path / "t.bin")
    assert p.read_bytes() == ids.astype("<u2").tobytes()  # raw uint16, no header (nanoGPT's .bin format)
    m = load_tokens(p)
    assert isinstance(m, np.memmap) and m.dtype == np.uint16 and (m == ids).all()
    with pytest.raises(ValueError, match="uint16"):
        save_tokens([-1, 3], tmp_path / "bad.bin")
    assert not (tmp_path / "bad.bin").exists()


def test_load_token_data_char(chars, shakespeare):
    n_train = int(len(shakespeare) * 0.9)
    assert chars.vocab_size == 65 and chars.train.dtype == np.uint16
    assert len(chars.train) == n_train and len(chars.val) == len(shakespeare) - n_train
    assert chars.tokenizer.decode(chars.val[:100]) == shakespeare[n_train : n_train + 100]
    # an explicit tokenizer object (what a resumed run passes) gives the same ids
    again = load_token_data(chars.tokenizer)
    assert (again.train == chars.train).all()


def test_load_token_data_from_path(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("abcabcabcd" * 10, encoding="utf-8")
    d = load_token_data("char", path=f)
    assert d.vocab_size == 4 and len(d.train) == 90
    with pytest.raises(FileNotFoundError, match="missing.txt does not exist"):
        load_token_data("char", path=tmp_path / "missing.txt")


@pytest.mark.slow
def test_load_token_data_bpe_is_cached(tmp_path, monkeypatch, shakespeare):
    from gptbook.tokenizer import BPETokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    text = shakespeare[:20_000]
    f = tmp_path / "t.txt"
    f.write_text(text, encoding="utf-8")
    a = load_token_data("bpe", vocab_size=300, path=f)
    assert isinstance(a.tokenizer, BPETokenizer) and a.vocab_size <= 300
    assert a.tokenizer.decode(list(a.train) + list(a.val)) == text
    cached = sorted(p.name for p in (tmp_path / "cache" / "gptbook" / "tokens").iterdir())
    assert [p.split(".", 1)[1] for p in cached] == ["json", "npy"]  # the tokenizer and the text's ids
    monkeypatch.setattr(BPETokenizer, "train", None)  # a second call must not train
    b = load_token_data("bpe", vocab_size=300, path=f)
    assert isinstance(b.train, np.memmap) and (np.asarray(b.train) == np.asarray(a.train)).all()


def test_a_cache_that_cannot_be_written_only_costs_time(tmp_path, monkeypatch, shakespeare):
    "A read-only or full cache folder is no reason to stop a run: the tokenizer is trained again."
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    f = tmp_path / "t.txt"
    f.write_text(shakespeare[:5_000], encoding="utf-8")
    assert load_token_data("bpe", vocab_size=280, path=f).vocab_size <= 280


# --- loss, schedule, optimizer -------------------------------------------------------------------


def test_lm_loss_matches_numpy():
    rng = np.random.default_rng(0)
    logits, targets = rng.normal(size=(2, 5, 7)), rng.integers(0, 7, (2, 5))
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, targets[..., None], -1).mean()
    got = lm_loss(torch.tensor(logits, dtype=torch.float32), torch.tensor(targets))
    assert got.item() == pytest.approx(expected, rel=1e-5)


@settings(max_examples=50, deadline=None)
@given(warmup=st.integers(0, 200), extra=st.integers(1, 3000), max_lr=st.floats(1e-5, 1.0), ratio=st.floats(0.0, 1.0))
def test_lr_schedule_shape(warmup, extra, max_lr, ratio):
    N, min_lr = warmup + extra, max_lr * ratio
    lrs = [lr_at(t, max_lr, warmup, N, min_lr) for t in range(N + 5)]
    # warmup: linear from max_lr / W up to max_lr
    for t in range(warmup):
        assert lrs[t] == pytest.approx(max_lr * (t + 1) / warmup)
    # decay: starts at the peak, never increases, ends at min_lr, and stays there
    if warmup < N:
        assert lrs[warmup] == pytest.approx(max_lr)
    assert all(a >= b - 1e-15 for a, b in zip(lrs[warmup:], lrs[warmup + 1 :]))
    assert all(v == pytest.approx(min_lr) for v in lrs[N:])
    assert all(0 < v <= max_lr + 1e-12 for v in lrs[:warmup])
    assert all(min_lr - 1e-12 <= v <= max_lr + 1e-12 for v in lrs[warmup:])
    # half-way through the decay the cosine is exactly half-way between the two rates
    if (N - warmup) % 2 == 0:
        assert lrs[warmup + (N - warmup) // 2] == pytest.approx((max_lr + min_lr) / 2)


def test_param_groups_cover_every_parameter_once():
    for config in (GPTConfig.baby(65), dataclasses.replace(GPTConfig.baby(65), tie_weights=False)):
        model = GPT(config)
        decay, rest = param_groups(model, 0.1)
        ids = [id(p) for g in (decay, rest) for p in g["params"]]
        assert len(ids) == len(set(ids)) == len({id(p) for p in model.parameters()})
        assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
        assert all(p.dim() == 2 for p in decay["params"])
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        assert embeddings and not embeddings & {id(p) for p in decay["params"]}
        linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - embeddings
        assert linear == {id(p) for p in decay["params"]}


def test_adamw_decays_exactly_the_decay_group():
    "With zero gradients AdamW's only effect is the decay: decayed weights shrink by (1 - lr * wd), others stay."
    model = GPT(tiny_config(bias=True))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    decayed = {id(p) for p in param_groups(model, 0.1)[0]["params"]}
    opt = make_optimizer(model, lr=0.5, weight_decay=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = (1 - 0.5 * 0.1) if id(p) in decayed else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, msg=n)


def test_presets_and_overrides():
    assert choices_of(field_types(TrainConfig)["preset"]) == PRESETS
    assert GPTConfig.from_preset("gpt2-small", 100).vocab_size == 100
    with pytest.raises(OptionError, match="n_layerz") as e:
        TrainConfig(model_overrides={"n_layerz": 3})  # caught when the config is built, not when training starts
    assert e.value.field == "model_overrides"


def test_train_config_validates_and_roundtrips():
    cfg = TrainConfig(max_iters=7, model_overrides={"n_layers": 2})
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    for bad in ({"batch_size": 0}, {"lr": 0.0}, {"tokenizer": ""}, {"max_iters": -1}, {"dtype": "float16"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainConfig(**bad)
    with pytest.raises(OptionError, match="unknown TrainConfig field"):
        TrainConfig.from_dict({**cfg.to_dict(), "learning_rate": 0.1})  # a typo is an error, never a default


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"max_iters": 0}, "max_iters must be at least 1, got 0 (a run that takes no step saves nothing)"),
        ({"lr": 0.0}, "lr must be positive, got 0.0"),
        ({"beta2": 1.0}, "beta2 must be in [0, 1), got 1.0"),
        ({"val_fraction": 1.0}, "val_fraction must be in (0, 1), got 1.0"),
        ({"min_lr_ratio": 2.0}, "min_lr_ratio must be in [0, 1], got 2.0"),
        ({"grad_clip": -1.0}, "grad_clip must be >= 0, got -1.0 (0 turns clipping off)"),
        ({"weight_decay": -1.0}, "weight_decay must be >= 0, got -1.0"),
        ({"tokenizer": ""}, "tokenizer must be a non-empty string, got ''"),
        ({"batch_size": 1.5}, "batch_size must be an integer, got 1.5"),
    ],
)
def test_train_config_messages(bad, message):
    with pytest.raises(OptionError) as e:
        TrainConfig(**bad)
    assert str(e.value) == message and e.value.field == next(iter(bad))


def test_every_field_has_help():
    for f in dataclasses.fields(TrainConfig):
        assert f.metadata["help"], f.name
    assert {f.name: f.metadata["flag"] for f in dataclasses.fields(TrainConfig) if f.metadata["flag"]} == {
        "out_dir": "--out",
        "data_path": "--data",
    }
    assert [f.name for f in dataclasses.fields(TrainConfig) if not f.metadata["cli"]] == ["model_overrides"]


# --- the loop ------------------------------------------------------------------------------------


def test_grad_accum_equals_one_big_batch(chars, tmp_path):
    a = new_trainer(chars, tiny_cfg(tmp_path / "a", batch_size=8), tiny_config())
    b = new_trainer(chars, tiny_cfg(tmp_path / "b", batch_size=2, grad_accum=4), tiny_config())
    for _ in range(3):
        sa, sb = a.train_step(), b.train_step()
        assert sa["loss"] == pytest.approx(sb["loss"], abs=1e-5)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)


def test_metrics_and_checkpoint_files(chars, tmp_path):
    t = new_trainer(chars, tiny_cfg(tmp_path, keep_last=2), tiny_config())
    t.fit()
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["iter"] for r in recs] == [0, 5, 10, 15, 20]
    for r in recs:
        assert {"iter", "train_loss", "val_loss", "lr", "tokens_per_sec", "grad_norm"} <= set(r)
        assert all(isinstance(r[k], float) for k in ("train_loss", "val_loss", "lr", "tokens_per_sec"))
    assert all(r["tokens_per_sec"] > 0 and r["grad_norm"] > 0 for r in recs[1:])
    assert recs[-1]["val_loss"] < recs[0]["val_loss"]
    assert recs[0]["train_loss"] == pytest.approx(math.log(65), abs=0.3)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_0000015", "ckpt_0000020"]
    ck = load_checkpoint(tmp_path)
    assert ck.iter == 20 and not ck.model.training and isinstance(ck.tokenizer, CharTokenizer)
    assert TrainConfig.from_dict(ck.state["train_config"]) == t.cfg and ck.model.config == tiny_config()
    x = torch.randint(0, 65, (2, 16))
    torch.testing.assert_close(ck.model(x), t.model.eval()(x))
    assert next(load_checkpoint(tmp_path, device="cpu").model.parameters()).device.type == "cpu"


def test_every_record_names_the_machine_its_timings_come_from(chars, tmp_path, capsys, monkeypatch):
    "The header and every metrics record name the CPU model, its CPUs, torch's threads and torch's version."
    import os
    import platform

    from gptbook import runs

    cpuinfo = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
    model = names[0] if names else platform.processor() or "an unnamed CPU"
    threads = torch.get_num_threads()
    plural = "s" if threads > 1 else ""
    expected = f"{model}, {os.cpu_count()} CPUs, {threads} thread{plural}, torch {torch.__version__}"
    assert runs.machine("cpu") == expected
    train(tiny_cfg(tmp_path / "run", max_iters=10), tiny_config(), data=chars)
    assert f"\nmachine: {expected}\n" in capsys.readouterr().out
    assert [r["machine"] for r in read_metrics(tmp_path / "run")] == [expected] * 3
    monkeypatch.setattr(runs.platform, "processor", lambda: "")
    monkeypatch.setattr("builtins.open", lambda *a, **k: (_ for _ in ()).throw(OSError("no /proc here")))
    assert runs.machine("cpu").startswith(f"an unnamed CPU, {os.cpu_count()} CPUs")  # macOS, Windows: no /proc


def test_resume_is_bit_exact(chars, tmp_path):
    "k steps + save + (kill) + resume + (N - k) steps == N straight steps: identical weights and losses, on CPU."
    config = tiny_config(dropout=0.1)  # dropout makes the torch RNG state matter too
    cfg = dict(max_iters=24, eval_interval=6, grad_accum=2)
    straight = new_trainer(chars, tiny_cfg(tmp_path / "straight", **cfg), config)
    straight.fit()
    first = new_trainer(chars, tiny_cfg(tmp_path / "resumed", **cfg), config)
    first.fit(stop_at=12)
    torch.manual_seed(999)  # anything the new process does before loading must not matter
    np.random.seed(5)
    rest = train(tiny_cfg(tmp_path / "resumed", **cfg), resume=True, data=chars)
    for (name, p), q in zip(straight.model.state_dict().items(), rest.model.state_dict().values()):
        assert torch.equal(p, q), name
    opt_a, opt_b = straight.optimizer.state_dict(), rest.optimizer.state_dict()
    assert opt_a["param_groups"] == opt_b["param_groups"]
    assert opt_a["state"].keys() == opt_b["state"].keys()
    for i, s in opt_a["state"].items():
        assert s.keys() == opt_b["state"][i].keys() and all(
            torch.equal(v, opt_b["state"][i][k]) for k, v in s.items()
        ), i

    def strip(recs):
        return [(r["iter"], r["train_loss"], r["val_loss"], r["lr"], r["grad_norm"]) for r in recs]

    assert strip(read_metrics(tmp_path / "resumed")) == strip(read_metrics(tmp_path / "straight"))


def test_resume_trims_metrics_past_the_checkpoint(chars, tmp_path):
    t = new_trainer(chars, tiny_cfg(tmp_path, max_iters=10), tiny_config())
    t.fit()
    # a record of a step that was never checkpointed, as a run killed after logging would leave
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({**read_metrics(tmp_path)[-1], "iter": 15}) + "\n")
    t2 = new_trainer(chars, tiny_cfg(tmp_path, max_iters=10), tiny_config())
    t2.load(read_state(tmp_path))
    assert [r["iter"] for r in read_metrics(tmp_path)] == [0, 5, 10]


def test_fresh_run_replaces_an_old_one_with_overwrite(chars, tmp_path):
    new_trainer(chars, tiny_cfg(tmp_path, max_iters=10), tiny_config()).fit()
    cfg = tiny_cfg(
        tmp_path, max_iters=5, model_overrides={"n_layers": 1, "n_heads": 2, "d_model": 32, "max_seq_len": 16}
    )
    with pytest.raises(FileExistsError, match="--overwrite"):
        train(cfg, data=chars)
    train(cfg, data=chars, overwrite=True)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_0000005"]
    assert [r["iter"] for r in read_metrics(tmp_path)] == [0, 5]


def test_nan_stops_the_run_and_keeps_the_last_good_checkpoint(chars, tmp_path):
    t = new_trainer(chars, tiny_cfg(tmp_path, eval_interval=4), tiny_config())
    calls = {"n": 0}

    def poison(module, inputs, output):  # from the 7th training forward on (step 6), the logits are NaN
        if not module.training:
            return output
        calls["n"] += 1
        return output * float("nan") if calls["n"] > 6 else output

    t.model.register_forward_hook(poison)
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    with pytest.raises(TrainingDiverged, match=r"at step (\d+)") as e:
        t.fit()
    step = t.step
    assert f"at step {step}" in str(e.value) and "ckpt_0000004" in str(e.value)
    assert step == 6
    ck = load_checkpoint(tmp_path)
    assert ck.iter == 4 and all(torch.isfinite(v).all() for v in ck.model.state_dict().values())
    assert all(torch.isfinite(p).all() for p in t.model.parameters())  # the NaN step was never applied
    assert any(not torch.equal(before[k], v) for k, v in t.model.state_dict().items())


def test_missing_checkpoint_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="gptbook train --out"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        load_checkpoint(tmp_path / "empty")


# --- the run config ------------------------------------------------------------------------------


def test_a_run_writes_its_config_and_can_be_replayed(chars, tmp_path):
    overrides = {"n_layers": 1, "n_heads": 2, "d_model": 32, "max_seq_len": 16}
    first = train(tiny_cfg(tmp_path / "a", max_iters=6, model_overrides=overrides), data=chars)
    written = {"train_config": first.cfg.to_dict(), "model_config": first.model.config.to_dict()}
    assert json.loads((tmp_path / "a" / "config.json").read_text()) == written
    assert load_run_config(tmp_path / "a") == load_run_config(tmp_path / "a" / "config.json") == written
    assert load_run_config(list_checkpoints(tmp_path / "a")[-1]) == written  # a checkpoint's state.json
    (tmp_path / "a" / "config.json").unlink()
    assert load_run_config(tmp_path / "a") == written  # a run killed before it wrote one: its latest checkpoint
    cfg, model_config = TrainConfig.from_dict(written["train_config"]), GPTConfig.from_dict(written["model_config"])
    again = train(cfg.replace(out_dir=str(tmp_path / "b")), model_config, data=chars)
    assert [r["val_loss"] for r in again.history] == [r["val_loss"] for r in first.history]


def test_run_config_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json does not exist"):
        load_run_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        load_run_config(tmp_path / "bad.json")
    (tmp_path / "flat.json").write_text(json.dumps(TrainConfig().to_dict()))
    with pytest.raises(ValueError, match='no "train_config"'):
        load_run_config(tmp_path / "flat.json")
    (tmp_path / "typo.json").write_text(json.dumps({"train_config": {"max_iter": 5}}))
    with pytest.raises(OptionError, match="max_iter"):
        TrainConfig.from_dict(load_run_config(tmp_path / "typo.json")["train_config"])
    save_run_config(tmp_path / "run", TrainConfig(max_iters=5).to_dict(), None)  # no model config: the preset
    assert load_run_config(tmp_path / "run") == {
        "train_config": TrainConfig(max_iters=5).to_dict(),
        "model_config": None,
    }


def test_one_process_ranks():
    assert init_distributed() == Ranks(0, 0, 1) == Ranks()


def test_feedback_header_summary_and_state(chars, tmp_path, capsys):
    "A run says what it trains and where, a line every 10% without a terminal, and how it ended."
    import gptbook

    cfg = tiny_cfg(tmp_path / "run", max_iters=20, eval_interval=10).replace(progress=True)
    train(cfg, tiny_config(), data=chars)
    out = capsys.readouterr().out
    for text in ("parameters on cpu in float32", "tokens per step", "(fresh)", "best val loss", "metrics: "):
        assert text in out, text
    assert "step 2/20 (10%): loss" in out and "step 18/20 (90%)" in out  # pytest's stderr is no terminal
    assert f"checkpoint: {tmp_path / 'run' / 'ckpt_0000020'}" in out
    assert "gptbook sample" not in out  # the command line's closing line, not the Python API's
    state = json.loads((tmp_path / "run" / "ckpt_0000020" / "state.json").read_text())
    assert state["gptbook_version"] == gptbook.__version__
    assert state["val_loss"] == read_metrics(tmp_path / "run")[-1]["val_loss"]
    train(cfg.replace(max_iters=30), resume=True, data=chars)
    assert "resuming from step 20" in capsys.readouterr().out


# --- the cached baby run (gptbook.book.baby) ---------------------------------------------------------


@pytest.fixture
def tiny_baby(monkeypatch, shakespeare_path):
    "baby_run with a seconds-long config in place of the real one; returns the list of trainings it started."
    import gptbook.book.baby as baby

    def tiny_baby_config(tokenizer="char"):
        overrides = {"n_layers": 1, "n_heads": 2, "d_model": 16, "max_seq_len": 16}
        return TrainConfig(
            tokenizer=tokenizer,
            progress=False,
            max_iters=4,
            eval_interval=2,
            eval_iters=1,
            batch_size=2,
            warmup_iters=1,
            model_overrides=overrides,
            threads=1,  # no probe of the machine's load (one test replaces time.sleep)
        )

    trainings = []
    real_train = baby.train

    def counting_train(cfg, *args, **kw):
        trainings.append(kw.get("resume"))
        return real_train(cfg, *args, **kw)

    monkeypatch.setattr(baby, "baby_config", tiny_baby_config)
    monkeypatch.setattr(baby, "train", counting_train)
    return trainings


def test_baby_run_trains_once_then_is_found(tiny_baby, tmp_path, capsys):
    from gptbook.book.baby import baby_run

    run = baby_run(cache_dir=tmp_path)
    assert "trained in" in capsys.readouterr().out.splitlines()[-1]
    assert run.parent == tmp_path / "runs" and run.name.startswith("baby-char-")
    assert [r["iter"] for r in read_metrics(run)] == [0, 2, 4]
    model = load_checkpoint(run).model
    assert model.config.n_layers == 1 and model.config.vocab_size == 65
    assert baby_run(cache_dir=tmp_path) == run
    assert capsys.readouterr().out.strip() == f"baby run (char): found {run}"
    assert tiny_baby == [False], "the second call must not train again"


def test_an_interrupted_baby_run_resumes(tiny_baby, tmp_path, monkeypatch):
    import gptbook.book.baby as baby

    real_fit = Trainer.fit

    def ctrl_c_after_the_first_checkpoint(self, stop_at=None):
        real_fit(self, stop_at=2)
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "fit", ctrl_c_after_the_first_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        baby.baby_run(cache_dir=tmp_path)
    monkeypatch.setattr(Trainer, "fit", real_fit)
    run = baby.baby_run(cache_dir=tmp_path)
    assert tiny_baby == [False, True] and load_checkpoint(run).iter == 4  # the second call resumed from step 2


def test_a_damaged_baby_run_is_trained_again(tiny_baby, tmp_path):
    from gptbook.book.baby import baby_run

    run = baby_run(cache_dir=tmp_path)
    f = list_checkpoints(run)[-1] / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-8] + bytes(8))  # a damaged copy must not be returned
    assert baby_run(cache_dir=tmp_path) == run and tiny_baby == [False, False]
    load_checkpoint(run)


def test_a_baby_run_that_another_process_trains_is_waited_for(tiny_baby, tmp_path, monkeypatch):
    import shutil

    import gptbook.book.baby as baby
    from gptbook.runs import run_lock

    run = baby.baby_run(cache_dir=tmp_path)  # the folder's name
    shutil.rmtree(run)
    other = run_lock(run)
    other.__enter__()  # another process starts training it, holding the run's lock

    def the_other_process_finishes(seconds):
        assert seconds == 5
        other.__exit__(None, None, None)
        baby.train(baby.baby_config().replace(out_dir=str(run)))

    monkeypatch.setattr(baby.time, "sleep", the_other_process_finishes)
    assert baby.baby_run(cache_dir=tmp_path) == run
    assert tiny_baby == [False, False, None]  # ours, the attempt refused by the lock, the other process's


def test_baby_config():
    from gptbook.book.baby import baby_config

    assert baby_config() == TrainConfig(progress=False)  # what `gptbook train` runs with no arguments
    assert baby_config("bpe") == TrainConfig(tokenizer="bpe", progress=False)
    with pytest.raises(ValueError, match="tokenizer must be 'char' or 'bpe', got 'word'"):
        baby_config("word")


@pytest.mark.parametrize("field, value", [("tokenizer", "bpe"), ("bpe_vocab_size", 1024), ("preset", "gpt2-small")])
def test_init_from_refuses_what_the_weights_fix(field, value):
    "The Python API refuses what `gptbook train --init-from` refuses: the weights decide the model and tokenizer."
    with pytest.raises(OptionError, match=f"init_from='run' fixes the model .*leave {field} at its default") as e:
        TrainConfig(init_from="run", **{field: value})
    assert e.value.field == field
    TrainConfig(init_from="run")  # the defaults are fine


# --- CPU threads, the Ctrl-C hint, an all-warmup run, TensorBoard (issue 26: F1, F14, logging) ---------------


def test_threads_are_set_and_the_header_prints_the_count_used(chars, tmp_path, capsys):
    train(tiny_cfg(tmp_path / "run", threads=2, max_iters=5), tiny_config(), data=chars)
    assert ", 2 threads, torch " in capsys.readouterr().out
    assert torch.get_num_threads() == 1  # train gives the caller's count back (the one_thread fixture's)


def test_the_default_thread_count_leaves_the_busy_cpus_alone(monkeypatch):
    "None or 0: the CPUs this process may use, less those other jobs keep busy; at least 1, at most torch's count."
    from gptbook import runs as tr

    monkeypatch.setattr(tr.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(tr, "_TORCH_THREADS", 2)
    for busy, expected in [(0.0, 2), (0.3, 2), (0.9, 1), (1.6, 1), (7.0, 1)]:
        monkeypatch.setattr(tr, "_busy_cpus", lambda busy=busy: busy)
        assert tr.pick_threads() == expected == torch.get_num_threads(), busy
        assert tr.pick_threads(0) == expected
    monkeypatch.setattr(tr, "_busy_cpus", lambda: 0.0)
    monkeypatch.setattr(tr, "_TORCH_THREADS", 1)  # OMP_NUM_THREADS=1, or one core: never more than that
    assert tr.pick_threads() == 1
    assert tr.pick_threads(3) == 3 == torch.get_num_threads()  # a number is taken as given


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="the probe reads /proc/stat (Linux)")
def test_the_probe_sees_a_cpu_bound_neighbour():
    "A real measurement: a child process that spins keeps about one CPU busy (more if the machine is busy too)."
    import subprocess
    import sys
    import time

    from gptbook.runs import _busy_cpus

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        busy = _busy_cpus(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert busy >= 0.7, busy


def test_the_threads_flag_of_train_and_sample():
    from gptbook.cli import build_parser

    assert build_parser("train").parse_args(["train", "--threads", "1"]).threads == 1
    assert build_parser("sample").parse_args(["sample", "out", "--threads", "2"]).threads == 2
    with pytest.raises(OptionError, match="threads"):
        TrainConfig(threads=-1)


def test_after_ctrl_c_the_hint_is_the_last_thing_on_the_terminal(chars, tmp_path, capsys, monkeypatch):
    "F14: the bar is closed before the resume hint is printed, so it is not drawn again below the hint."
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar is drawn
    trainer = new_trainer(chars, tiny_cfg(tmp_path / "run", progress=True), tiny_config())
    take_step = trainer.train_step

    def ctrl_c_at_step_7():
        if trainer.step == 7:
            raise KeyboardInterrupt
        return take_step()

    trainer.train_step = ctrl_c_at_step_7
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    err = capsys.readouterr().err
    assert "7/20" in err  # the bar was drawn
    assert err.rstrip().endswith(f"continue with: gptbook train --out {tmp_path / 'run'} --resume"), err[-300:]


def test_an_all_warmup_run_warns_in_one_line(chars, tmp_path, capsys):
    "F14: a run with max_iters <= warmup_iters ends at the peak learning rate: one warning (the CLI: one line)."
    import warnings

    with pytest.warns(UserWarning, match="3 steps, 3 of warmup: the learning rate only rises"):
        train(tiny_cfg(tmp_path / "a", max_iters=3, warmup_iters=3, eval_interval=3), tiny_config(), data=chars)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train(tiny_cfg(tmp_path / "b", max_iters=4, warmup_iters=3, eval_interval=4), tiny_config(), data=chars)
    from gptbook.cli import main

    tiny = ["--n-layers", "1", "--n-heads", "2", "--d-model", "32", "--max-seq-len", "16", "--batch-size", "2"]
    args = ["train", "--out", str(tmp_path / "c"), "--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1"]
    capsys.readouterr()
    assert main([*args, "--threads", "1", "--no-progress", "--sample-tokens", "0", *tiny]) == 0
    err = capsys.readouterr().err
    assert err == "gptbook train: warning: 2 steps, 100 of warmup: the learning rate only rises\n", err


def test_tensorboard_gets_the_metrics_of_metrics_jsonl(chars, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    train(tiny_cfg(run, max_iters=10, logger="tensorboard"), tiny_config(), data=chars)
    events = EventAccumulator(str(run)).Reload()
    for name in ("train_loss", "val_loss", "lr", "tokens_per_sec", "grad_norm", "ms_per_iter", "elapsed_s"):
        written = [(r["iter"], r[name]) for r in read_metrics(run) if r[name] is not None]
        logged = [(e.step, e.value) for e in events.Scalars(name)]
        assert [s for s, _ in logged] == [s for s, _ in written], name
        assert np.allclose([v for _, v in logged], [v for _, v in written], rtol=1e-6), name  # float32 in the file


def test_without_a_logger_nothing_else_is_written(chars, tmp_path):
    train(tiny_cfg(tmp_path / "run", max_iters=5), tiny_config(), data=chars)
    assert not any("tfevents" in p.name for p in (tmp_path / "run").rglob("*"))


def test_tensorboard_missing_is_one_line_naming_the_extra(chars, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    one_line = r'^the tensorboard logger needs TensorBoard: pip install "gptbook\[tensorboard\]"$'
    with pytest.raises(ImportError, match=one_line):
        train(tiny_cfg(tmp_path / "run", max_iters=5, logger="tensorboard"), tiny_config(), data=chars)
    assert not list_checkpoints(tmp_path / "run")


def test_the_default_thread_count_is_counted_again_after_each_evaluation(chars, tmp_path, monkeypatch):
    "A job that starts (or ends) during a run: the count follows at the next evaluation; records name each count."
    from gptbook import runs as tr

    monkeypatch.setattr(tr.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(tr, "_TORCH_THREADS", 2)
    busy = iter([0.0, 1.0, 0.0, 0.0])  # at the start, after step 5, after step 10, after step 15
    monkeypatch.setattr(tr, "_busy_cpus", lambda: next(busy))
    torch.set_num_threads(2)  # the caller's count: the most the default takes, and the count train gives back
    train(tiny_cfg(tmp_path / "run", threads=None, max_iters=15), tiny_config(), data=chars)
    used = [re.search(r", (\d+) threads?,", r["machine"])[1] for r in read_metrics(tmp_path / "run")]
    assert used == ["2", "2", "1", "2"]  # records at steps 0, 5, 10, 15: the threads of the steps before each
    assert torch.get_num_threads() == 2


def test_the_default_thread_count_never_exceeds_the_callers(chars, tmp_path, monkeypatch):
    "A caller that set torch.set_num_threads(1) keeps one thread, even on an idle machine, and gets it back."
    from gptbook import runs as tr

    monkeypatch.setattr(tr, "_busy_cpus", lambda: 0.0)
    monkeypatch.setattr(tr, "_TORCH_THREADS", 2)
    torch.set_num_threads(1)  # (the one_thread fixture's count)
    train(tiny_cfg(tmp_path / "run", threads=None, max_iters=10), tiny_config(), data=chars)
    used = {re.search(r", (\d+) threads?,", r["machine"])[1] for r in read_metrics(tmp_path / "run")}
    assert used == {"1"} and torch.get_num_threads() == 1
