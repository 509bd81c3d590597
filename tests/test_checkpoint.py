"""gptbook.checkpoint: atomic writes, the checkpoint folder (pickle-free, tied weights stored once, optimizer
and RNG state), rotation, leftovers, damaged files, and a process killed in the middle of a save."""

import json
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

from gptbook.checkpoint import (
    CKPT_FILES,
    checkpoint_state,
    clear_checkpoints,
    find_checkpoint,
    list_checkpoints,
    load_optimizer_state,
    load_weights,
    restore_rng,
    save_checkpoint,
)
from gptbook.files import atomic_dir, atomic_write, sha256_of
from gptbook.model import GPT, GPTConfig
from gptbook.tokenizer import CharTokenizer
from gptbook.train import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def tiny_gpt(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig.baby(65, n_layers=1, n_heads=2, d_model=32, max_seq_len=16, **kw))


def stepped_adamw(model):
    "An AdamW that has taken two steps, so that it has moments and step counts to save."
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    for _ in range(2):
        model(torch.randint(0, 65, (2, 8))).sum().backward()
        opt.step()
        opt.zero_grad()
    return opt


# --- atomic writes -------------------------------------------------------------------------------


def test_sha256_of_known_vectors_in_any_block_size(tmp_path):
    "FIPS 180-2 test vectors; the data chapter checks its files with the same function (gptbook.data has no copy)."
    import gptbook.data

    p = tmp_path / "abc"
    p.write_bytes(b"abc")
    for block_size in (1, 2, 1 << 20):
        assert sha256_of(p, block_size) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    p.write_bytes(b"")
    assert sha256_of(p) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert gptbook.data.sha256_of is sha256_of and not hasattr(gptbook.data, "sha256_file")


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    f = tmp_path / "a.txt"
    with atomic_write(f) as out:
        out.write("first")
    with pytest.raises(RuntimeError):
        with atomic_write(f) as out:
            out.write("second, torn")
            raise RuntimeError("killed")
    assert f.read_text() == "first" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]
    with atomic_write(f, "wb") as out:
        out.write(b"\x00\x01")
    assert f.read_bytes() == b"\x00\x01"


def test_atomic_write_gives_a_path_to_writers_that_take_one(tmp_path):
    tok = CharTokenizer.train("hello")
    with atomic_write(tmp_path / "tok.json", mode=None) as tmp:
        assert tmp.parent == tmp_path and tmp.name != "tok.json"
        tok.save(tmp)
    assert CharTokenizer.load(tmp_path / "tok.json").chars == tok.chars
    assert [p.name for p in tmp_path.iterdir()] == ["tok.json"]


def test_atomic_write_gives_the_usual_permissions(tmp_path):
    "mkstemp makes files private (0600); the finished file gets what `open` would give under the umask."
    mask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "a.txt") as out:
            out.write("x")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644


def test_atomic_dir_replaces_an_existing_folder_and_cleans_up_on_error(tmp_path):
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "one").write_text("1")
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "two").write_text("2")
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["two"]
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "three").write_text("3")
            raise KeyboardInterrupt
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["two"]
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temporary or trash folder left


# --- the checkpoint folder -----------------------------------------------------------------------


def test_round_trip_restores_weights_optimizer_and_every_rng(tmp_path):
    model = tiny_gpt(dropout=0.1)
    opt = stepped_adamw(model)
    batches = torch.Generator().manual_seed(3)
    torch.randint(0, 10, (5,), generator=batches)  # a generator that has been used
    folder = save_checkpoint(tmp_path, 7, model, opt, batches, meta={"note": "hi"})
    after_save = (torch.rand(4), np.random.rand(4), random.random(), torch.rand(4, generator=batches))

    state = checkpoint_state(tmp_path)
    assert (state["path"], state["iter"], state["note"]) == (folder, 7, "hi")
    other = tiny_gpt()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    load_weights(other, folder)
    for (name, p), q in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(p, q), name
    assert other.lm_head.weight is other.wte.weight  # the tie survives

    sd_a, sd_b = opt.state_dict(), load_optimizer_state(folder, state)
    assert sd_a["param_groups"] == sd_b["param_groups"]  # betas come back as a tuple
    assert sd_a["state"].keys() == sd_b["state"].keys()
    for i, s in sd_a["state"].items():
        assert s.keys() == sd_b["state"][i].keys() and all(torch.equal(v, sd_b["state"][i][k]) for k, v in s.items())

    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    g = torch.Generator().set_state(restore_rng(folder, state))
    assert torch.equal(torch.rand(4), after_save[0]) and (np.random.rand(4) == after_save[1]).all()
    assert random.random() == after_save[2] and torch.equal(torch.rand(4, generator=g), after_save[3])


def test_tied_head_is_stored_once_and_nothing_is_a_pickle(tmp_path):
    model = tiny_gpt()
    folder = save_checkpoint(
        tmp_path, 1, model, stepped_adamw(model), torch.Generator(), tokenizer=CharTokenizer.train("ab")
    )
    assert sorted(p.name for p in folder.iterdir()) == sorted(CKPT_FILES + ("tokenizer.json",))
    for f in folder.iterdir():  # safetensors (8-byte header length, then JSON) and JSON only
        head = f.read_bytes()[:16]
        assert not head.startswith(b"\x80"), f"{f.name} looks like a pickle"
        if f.suffix == ".json":
            json.loads(f.read_text())
        else:
            n = int.from_bytes(head[:8], "little")
            json.loads(f.read_bytes()[8 : 8 + n])
    n = int.from_bytes((folder / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((folder / "model.safetensors").read_bytes()[8 : 8 + n])
    assert ("wte.weight" in header) != ("lm_head.weight" in header)  # one copy of the tied matrix
    untied = tiny_gpt(tie_weights=False)
    folder = save_checkpoint(tmp_path / "untied", 1, untied)
    n = int.from_bytes((folder / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((folder / "model.safetensors").read_bytes()[8 : 8 + n])
    assert "wte.weight" in header and "lm_head.weight" in header


def test_keep_last_and_leftovers(tmp_path):
    model = nn.Linear(2, 2)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_0000002", "ckpt_0000003"]
    (tmp_path / ".tmp_ckpt_0000004_x").mkdir()  # what killed saves leave
    (tmp_path / ".trash_ckpt_0000001_1_2").mkdir()
    (tmp_path / "ckpt_notes").mkdir()  # not a checkpoint name: never touched
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_0000002", "ckpt_0000003"]
    save_checkpoint(tmp_path, 4, model, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_0000003", "ckpt_0000004", "ckpt_notes"]
    assert find_checkpoint(tmp_path).name == "ckpt_0000004"
    assert clear_checkpoints(tmp_path) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt_notes"]


def test_meta_may_not_overwrite_the_format_entries(tmp_path):
    with pytest.raises(ValueError, match="iter"):
        save_checkpoint(tmp_path, 1, nn.Linear(2, 2), meta={"iter": 5})
    assert not list_checkpoints(tmp_path)


def test_missing_checkpoint_messages(tmp_path):
    with pytest.raises(FileNotFoundError, match="gptbook train --out"):
        find_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoint_state(tmp_path)
    folder = save_checkpoint(tmp_path, 1, nn.Linear(2, 2))
    (folder / "rng.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="incomplete: rng.safetensors is missing"):
        checkpoint_state(folder, CKPT_FILES)  # what a resume needs
    assert checkpoint_state(folder)["iter"] == 1  # inference needs only the weights and state.json


@pytest.mark.parametrize("damage", ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json"])
def test_a_damaged_file_is_an_error_naming_it(tmp_path, damage):
    model = tiny_gpt()
    folder = save_checkpoint(tmp_path, 1, model, stepped_adamw(model), torch.Generator())
    f = folder / damage
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])  # truncated, as by a disk that filled up
    with pytest.raises(ValueError, match="damaged") as e:
        state = checkpoint_state(folder)
        load_weights(tiny_gpt(), folder)
        load_optimizer_state(folder, state)
        restore_rng(folder, state)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_a_newer_format_is_refused(tmp_path):
    folder = save_checkpoint(tmp_path, 1, nn.Linear(2, 2))
    state = json.loads((folder / "state.json").read_text())
    (folder / "state.json").write_text(json.dumps({**state, "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        checkpoint_state(folder)


# --- atomic checkpoints: kill a process in the middle of a save -----------------------------------

_SAVER = textwrap.dedent("""
    import os, sys, time, shutil, torch
    import gptbook.checkpoint as C
    from gptbook.model import GPT, GPTConfig
    out = sys.argv[1]
    real_fsync, real_rmtree = os.fsync, shutil.rmtree
    def slow_fsync(fd): time.sleep(0.04); real_fsync(fd)          # widen the window of every save phase
    def slow_rmtree(p, **kw): time.sleep(0.1); real_rmtree(p, **kw)
    os.fsync, shutil.rmtree = slow_fsync, slow_rmtree
    torch.manual_seed(0)
    config = GPTConfig.baby(65)
    model = GPT(config)
    opt = torch.optim.AdamW(model.parameters())
    i = 0
    while True:
        i += 1
        with torch.no_grad():
            for p in model.parameters(): p.fill_(float(i))          # step i's weights are all equal to i
        print("begin", i, flush=True)
        C.save_checkpoint(out, i, model, opt, torch.Generator(), meta={"model_config": config.to_dict()})
        print("done", i, flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.03, 0.15, 0.27])
def test_kill_during_save_leaves_a_loadable_checkpoint(tmp_path, delay):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stdout:  # wait until save 2 is complete and save 3 has begun
            if line.split() == ["begin", "3"]:
                break
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    ck = load_checkpoint(tmp_path)
    assert ck.iter in (2, 3)
    assert all(torch.all(v == ck.iter) for v in ck.model.state_dict().values())
    for folder in list_checkpoints(tmp_path):  # every folder named ckpt_* is complete
        assert all((folder / f).is_file() for f in CKPT_FILES)
    # the next save cleans up what the killed one left behind
    save_checkpoint(tmp_path, 4, ck.model, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_0000004"]
