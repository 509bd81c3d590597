"""gptbook.files and gptbook.checkpoint: atomic writes, the one file reader, and a checkpoint folder saved whole,
read back exactly, and refused in one line when it is damaged, foreign, too large or planted with code."""

import json
import os
import pickle
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest
import torch
import torch.nn as nn

import gptbook.checkpoint as C
from gptbook.checkpoint import (
    list_checkpoints,
    load_checkpoint,
    load_training_state,
    load_weights,
    read_state,
    save_checkpoint,
)
from gptbook.files import atomic_dir, atomic_write, read_json, read_text, sha256_of
from gptbook.model import GPT, GPTConfig
from gptbook.tokenizer import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
CONFIG = GPTConfig.baby(65, n_layers=1, n_heads=2, d_model=32, max_seq_len=16)


def tiny_gpt(**kw):
    torch.manual_seed(0)
    return GPT(CONFIG.replace(**kw))


def stepped_adamw(model):
    "An AdamW that has taken two steps, so that it has moments and step counts to save."
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    for _ in range(2):
        model(torch.randint(0, 65, (2, 8))).sum().backward()
        opt.step()
        opt.zero_grad()
    return opt


def save(folder, step, model, *args, **kw):
    "save_checkpoint with the model config in state.json, as the trainer saves it."
    return save_checkpoint(folder, step, model, *args, meta={"model_config": model.config.to_dict()}, **kw)


# --- files ---------------------------------------------------------------------------------------


def test_sha256_of_known_vectors_in_any_block_size(tmp_path):
    "FIPS 180-2 test vectors."
    p = tmp_path / "abc"
    p.write_bytes(b"abc")
    for block_size in (1, 2, 1 << 20):
        assert sha256_of(p, block_size) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    p.write_bytes(b"")
    assert sha256_of(p) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


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


def test_written_files_get_the_usual_permissions(tmp_path):
    "mkstemp and safetensors make files private (0600); finished files get what `open` would give under the umask."
    mask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "a.txt") as out:
            out.write("x")
        folder = save(tmp_path / "run", 1, tiny_gpt())
    finally:
        os.umask(mask)
    for f in [tmp_path / "a.txt", *folder.iterdir()]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f.name


def test_a_file_where_a_folder_should_be_is_named(tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    for target in ("afile/x.json", "afile/sub/x.json"):
        with pytest.raises(OSError, match="afile is a file, not a folder"):
            with atomic_write(tmp_path / target) as f:
                f.write("{}")


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


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: "/dev/zero", "is not a regular file"),  # would be read forever
        (lambda d: d, "is not a regular file"),  # a folder
        (lambda d: d / "nope.txt", "does not exist"),
        (
            lambda d: (d / "l1.txt").write_bytes("café".encode("latin-1")) and d / "l1.txt",
            r"is not UTF-8 text \(byte 0xe9",
        ),
        (lambda d: (d / "big.txt").write_text("x" * 101) and d / "big.txt", "more than the 100"),
    ],
)
def test_the_one_reader_refuses_what_it_cannot_read_whole_naming_the_file(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises((OSError, ValueError), match=message) as e:
        read_text(path, max_bytes=100)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_read_json_names_the_file(tmp_path):
    (tmp_path / "c.json").write_text('{"a": ')
    with pytest.raises(ValueError, match="c.json is not valid JSON"):
        read_json(tmp_path / "c.json")
    (tmp_path / "c.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "c.json") == {"a": 1}


# --- a checkpoint ----------------------------------------------------------------------------------


def test_round_trip_restores_weights_optimizer_and_every_rng(tmp_path):
    model = tiny_gpt(dropout=0.1)
    opt = stepped_adamw(model)
    batches = torch.Generator().manual_seed(3)
    torch.randint(0, 10, (5,), generator=batches)  # a generator that has been used
    folder = save_checkpoint(tmp_path, 7, model, opt, batches, meta={"note": "hi", "model_config": CONFIG.to_dict()})
    after_save = (torch.rand(4), np.random.rand(4), random.random(), torch.rand(4, generator=batches))

    state = read_state(tmp_path)
    assert (state["path"], state["iter"], state["note"]) == (folder, 7, "hi")
    other = tiny_gpt(dropout=0.1)
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    load_weights(other, state)
    for (name, p), q in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(p, q), name
    assert other.lm_head.weight is other.wte.weight  # the tie survives

    opt2, g = torch.optim.AdamW(other.parameters(), lr=1e-2, betas=(0.9, 0.95)), torch.Generator()
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    load_training_state(state, opt2, g)
    sd_a, sd_b = opt.state_dict(), opt2.state_dict()
    assert sd_a["param_groups"] == sd_b["param_groups"]  # betas come back as a tuple
    for i, s in sd_a["state"].items():
        assert all(torch.equal(v, sd_b["state"][i][k]) for k, v in s.items())
    assert torch.equal(torch.rand(4), after_save[0]) and (np.random.rand(4) == after_save[1]).all()
    assert random.random() == after_save[2] and torch.equal(torch.rand(4, generator=g), after_save[3])


def test_a_tied_head_is_stored_once_and_no_file_is_a_plain_pickle(tmp_path):
    model = tiny_gpt()
    folder = save(tmp_path, 1, model, stepped_adamw(model), torch.Generator(), tokenizer=CharTokenizer.train("ab"))
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["model.safetensors", "state.json", "tokenizer.json", "training.pt"]
    assert set(json.loads((folder / "state.json").read_text())["sha256"]) == set(names) - {"state.json"}
    n = int.from_bytes((folder / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((folder / "model.safetensors").read_bytes()[8 : 8 + n])
    assert ("wte.weight" in header) != ("lm_head.weight" in header)  # one copy of the tied matrix
    assert zipfile.is_zipfile(folder / "training.pt")  # torch.save's zip, read with weights_only=True


class _Payload:
    "A pickle payload: unpickling it calls os.system, which would create the marker file."

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_is_refused_and_runs_nothing(tmp_path):
    "A forger replaces training.pt by a payload and updates its SHA-256 in state.json: the load refuses it."
    model = tiny_gpt()
    folder = save(tmp_path / "run", 1, model, stepped_adamw(model), torch.Generator())
    marker = tmp_path / "PWNED"
    for planted in (
        lambda f: torch.save({"optimizer": _Payload(marker)}, f),
        lambda f: f.write_bytes(pickle.dumps(_Payload(marker))),
    ):
        planted(folder / "training.pt")
        state = json.loads((folder / "state.json").read_text())
        state["sha256"]["training.pt"] = sha256_of(folder / "training.pt")
        (folder / "state.json").write_text(json.dumps(state))
        with pytest.raises(ValueError, match="training.pt cannot be read"):
            load_training_state(read_state(folder), stepped_adamw(tiny_gpt()), torch.Generator())
        assert not marker.exists()


def test_keep_last_keeps_the_newest_complete_checkpoints(tmp_path):
    model = nn.Linear(2, 2)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_0000002", "ckpt_0000003"]
    (tmp_path / "ckpt_notes").mkdir()  # not a checkpoint name: never touched
    save_checkpoint(tmp_path, 4, model, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_0000003", "ckpt_0000004", "ckpt_notes"]


def test_meta_may_not_overwrite_the_format_entries(tmp_path):
    with pytest.raises(ValueError, match="iter"):
        save_checkpoint(tmp_path, 1, nn.Linear(2, 2), meta={"iter": 5})
    assert not list_checkpoints(tmp_path)


def test_a_missing_checkpoint_or_file_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="gptbook train --out"):
        read_state(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no complete ckpt"):
        read_state(tmp_path)
    folder = save(tmp_path, 1, tiny_gpt())
    (folder / "training.pt").unlink()
    with pytest.raises(FileNotFoundError, match="incomplete: training.pt is missing"):
        load_training_state(read_state(folder), stepped_adamw(tiny_gpt()))
    assert load_checkpoint(folder).iter == 1  # inference needs only the weights and state.json


@pytest.mark.parametrize("damage", ["model.safetensors", "training.pt", "state.json"])
def test_a_damaged_file_is_one_line_naming_it(tmp_path, damage):
    model = tiny_gpt()
    folder = save(tmp_path, 1, model, stepped_adamw(model), torch.Generator())
    f = folder / damage
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])  # truncated, as by a disk that filled up
    with pytest.raises(ValueError, match="damaged|not valid JSON") as e:
        state = read_state(folder)
        load_checkpoint(folder)
        load_training_state(state, stepped_adamw(tiny_gpt()))
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_a_damaged_newest_checkpoint_says_how_to_use_the_older_one(tmp_path):
    for step in (2, 4):
        save(tmp_path, step, tiny_gpt(), keep_last=2)
    f = tmp_path / "ckpt_0000004" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1] + b"\x00")  # one changed byte: it still parses, its SHA-256 differs
    with pytest.raises(ValueError, match="SHA-256 differs") as e:
        load_checkpoint(tmp_path)
    assert f"mv {tmp_path / 'ckpt_0000004'}" in str(e.value) and str(tmp_path / "ckpt_0000002") in str(e.value)


def test_a_checkpoint_rotated_away_while_it_loads_is_read_again_from_the_newest(tmp_path, monkeypatch):
    "A run saving meanwhile removes the checkpoint between its checks and safetensors' mmap of the weights."
    model, real, steps = tiny_gpt(), C.load_model, iter([2, 3])
    save(tmp_path, 1, model)

    def rotated(m, filename):
        monkeypatch.setattr(C, "load_model", real)
        save(tmp_path, next(steps), model)  # keep_last=1: the checkpoint being read goes
        raise RuntimeError(f"unable to open file <{filename}> in read-only mode: No such file or directory (2)")

    monkeypatch.setattr(C, "load_model", rotated)
    assert load_checkpoint(tmp_path).iter == 2  # a run folder: its newest, read again
    monkeypatch.setattr(C, "load_model", rotated)
    with pytest.raises(FileNotFoundError, match="was removed while it was read"):  # a checkpoint folder: one line
        load_checkpoint(tmp_path / "ckpt_0000002")


def test_a_newer_format_is_refused(tmp_path):
    folder = save_checkpoint(tmp_path, 1, nn.Linear(2, 2))
    state = json.loads((folder / "state.json").read_text())
    (folder / "state.json").write_text(json.dumps({**state, "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        read_state(folder)


def test_weights_that_are_not_finite_are_never_saved_nor_loaded(tmp_path):
    model = tiny_gpt()
    folder = save(tmp_path, 1, model)
    with torch.no_grad():
        model.blocks[0].mlp.c_fc.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"blocks.0.mlp.c_fc.weight holds NaN"):
        save(tmp_path, 2, model)
    from safetensors.torch import load_file, save_file  # a forger writes NaN weights and fixes the SHA-256

    tensors = {k: torch.full_like(v, float("nan")) for k, v in load_file(folder / "model.safetensors").items()}
    save_file(tensors, folder / "model.safetensors")
    state = json.loads((folder / "state.json").read_text())
    state["sha256"]["model.safetensors"] = sha256_of(folder / "model.safetensors")
    (folder / "state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="holds NaN or infinite values"):
        load_checkpoint(folder)


def test_a_model_config_too_large_for_the_machine_is_refused_before_building(tmp_path):
    "An edited state.json asking for a million layers is one line, at once, not minutes of allocation."
    folder = save(tmp_path, 1, tiny_gpt())
    state = json.loads((folder / "state.json").read_text())
    state["model_config"]["n_layers"] = 10**6
    (folder / "state.json").write_text(json.dumps(state))
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="state.json: its model_config cannot be built .*more than this machine"):
        load_checkpoint(folder)
    assert time.perf_counter() - t0 < 5


def test_weights_of_another_model_name_the_shapes(tmp_path):
    save(tmp_path, 1, tiny_gpt(d_model=64))
    state = read_state(tmp_path)
    with pytest.raises(ValueError, match=r"weights of another model .*\[192, 64\] in the file but \[96, 32\]"):
        load_weights(tiny_gpt(), state)


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
def test_a_kill_during_a_save_leaves_a_loadable_checkpoint(tmp_path, delay):
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
    for folder in list_checkpoints(tmp_path):  # every folder named ckpt_* with a state.json is complete
        assert all((folder / f).is_file() for f in json.loads((folder / "state.json").read_text())["sha256"])


def test_another_tools_model_given_as_a_run_is_named_with_the_flag_that_reads_it(tmp_path, capsys):
    "F12: a nanoGPT ckpt.pt (or its out_dir) and a Hugging Face folder are not 'train a model with gptbook train'."
    from gptbook.cli import main
    from gptbook.hf import save_hf

    (tmp_path / "nano").mkdir()
    (tmp_path / "nano" / "ckpt.pt").write_bytes(b"not read")
    hf = save_hf(tiny_gpt(), tmp_path / "hf")
    for given, says in [
        (
            tmp_path / "nano",
            f"{tmp_path / 'nano' / 'ckpt.pt'} is a nanoGPT checkpoint, not a gptbook run: use --nanogpt",
        ),
        (tmp_path / "nano" / "ckpt.pt", "is a nanoGPT checkpoint, not a gptbook run: use --nanogpt"),
        (hf, f"{hf} is a Hugging Face model folder, not a gptbook run: use --hf {hf}"),
    ]:
        with pytest.raises(FileNotFoundError) as e:
            load_checkpoint(given)
        assert says in str(e.value) and "gptbook train" not in str(e.value)
        assert main(["sample", str(given)]) == 1 and says in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no checkpoint .*; train a model with `gptbook train --out"):
        load_checkpoint(tmp_path / "empty")
