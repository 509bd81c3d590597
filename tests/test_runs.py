"""Runs you cannot lose: the run folder's guarantees, each reproducing a case of the reliability reviews
(../shared/reviews/reliability.md), through the real command: one process per folder, a new run replacing an old one
in one step, divergence, full disks, damaged and foreign files, and the kill -9 campaigns."""

import errno
import functools
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

import gptbook.checkpoint as C
import gptbook.runs as R
from gptbook.checkpoint import list_checkpoints, load_checkpoint
from gptbook.cli import main
from gptbook.runs import RunLocked, read_metrics, run_lock
from gptbook.tokenizer import CharTokenizer
from gptbook.train import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
T = ["--eval-iters", "2", "--n-layers", "1", "--d-model", "32", "--n-heads", "2", "--device", "cpu", "--no-progress"]
T += ["--sample-tokens", "0", "--max-seq-len", "32", "--batch-size", "4"]

from test_cli import call  # noqa: E402  (run `gptbook *argv` in this process: one helper for both files)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def one_line_error(status, err, *texts):
    "The command failed with exit status 1 and a single line of stderr that holds every one of `texts`."
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("note:") and ": warning: " not in ln]
    assert status == 1 and len(lines) == 1 and "Traceback" not in err, err
    for t in texts:
        assert str(t) in lines[0], (t, lines[0])
    return lines[0]


def listing(folder) -> dict:
    "Every file under `folder` (but the lock) with its bytes: what a failed command must leave unchanged."
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def base(tmp_path_factory, shakespeare_path):
    "A good run: 20 steps, checkpoint ckpt_0000020 (the review's `base`)."
    out = tmp_path_factory.mktemp("rel") / "base"
    assert main(["train", "--out", str(out), "--max-iters", "20", "--eval-interval", "10", *T]) == 0
    return out


@pytest.fixture
def run(base, tmp_path):
    "A copy of the good run, to damage."
    dest = tmp_path / "run"
    shutil.copytree(base, dest)
    return dest


# --- a fresh run never destroys an earlier one ----------------------------------------


def test_a_fresh_run_refuses_a_folder_that_holds_a_run(capsys, run):
    before = listing(run)
    status, _, err = call(capsys, "train", "--out", run, "--max-iters", "4", *T)
    one_line_error(status, err, f"{run} holds a run", "ckpt_0000020", "--resume", "--overwrite")
    assert listing(run) == before


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--data", "SHORT"], "tokens, but a batch needs windows of context_len + 1 = 33"),
        (["--seed", str(10**23)], "--seed: seed must be in [0, 4294967295]"),
        (["--max-seq-len", "2000000"], "a batch needs windows of context_len + 1 = 2,000,001"),
    ],
)
def test_a_fresh_run_that_cannot_start_leaves_the_earlier_run_whole(capsys, run, tmp_path, bad, message):
    short = tmp_path / "short.txt"
    short.write_text(Path(os.environ["GPTBOOK_DATA"]).read_text(encoding="utf-8")[:50], encoding="utf-8")
    before = listing(run)
    argv = [str(short) if a == "SHORT" else a for a in bad]
    status, _, err = call(capsys, "train", "--out", run, "--overwrite", "--max-iters", "4", *T, *argv)
    one_line_error(status, err, message)
    assert listing(run) == before and load_checkpoint(run).iter == 20


def test_a_new_run_that_fails_before_its_first_checkpoint_leaves_the_old_one(capsys, run):
    old_metrics = (run / "metrics.jsonl").read_bytes()
    # a replacing run that diverges before its first checkpoint: the old run is still all there
    status, _, err = call(
        capsys, "train", "--out", run, "--overwrite", "--lr", "1e6", "--warmup-iters", "0", "--eval-interval", "1", *T
    )
    one_line_error(status, err, "step 1 was not saved", "No checkpoint of this run was saved yet")
    assert [p.name for p in list_checkpoints(run)] == ["ckpt_0000020"]
    assert (run / "metrics.jsonl").read_bytes() == old_metrics
    # a replacing run that saves: only its own checkpoint, metrics and config remain
    assert sorted(p.name for p in run.iterdir()) == [".lock", "ckpt_0000020", "config.json", "metrics.jsonl"]
    status, _, _ = call(capsys, "train", "--out", run, "--overwrite", "--max-iters", "6", "--eval-interval", "3", *T)
    assert status == 0
    assert [p.name for p in list_checkpoints(run)] == ["ckpt_0000006"]
    assert [r["iter"] for r in read_metrics(run)] == [0, 3, 6]
    assert json.loads((run / "config.json").read_text())["train_config"]["max_iters"] == 6


def test_a_folder_whose_run_saved_no_checkpoint_needs_no_overwrite(capsys, tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"iter": 0, "train_loss": 4.2, "val_loss": 4.2}\n')  # killed before a save
    (out / "config.json").write_text("{}")
    status, _, err = call(capsys, "train", "--out", out, "--max-iters", "4", "--eval-interval", "2", *T)
    assert status == 0, err
    assert [r["iter"] for r in read_metrics(out)] == [0, 2, 4] and load_checkpoint(out).iter == 4


# --- a diverged evaluation is never saved ---------------------------------------------------


@pytest.mark.parametrize("lr", ["1e30", "1e6"])  # NaN, and the review's exploded val loss (4.8e11)
def test_a_diverged_evaluation_is_never_saved(capsys, run, lr):
    status, _, err = call(
        capsys, "train", "--out", run, "--resume", "--lr", lr, "--eval-interval", "7", "--max-iters", "40"
    )
    one_line_error(
        status, err, "at step 21", "step 21 was not saved", f"last good checkpoint is {run / 'ckpt_0000020'}"
    )
    assert [p.name for p in list_checkpoints(run)] == ["ckpt_0000020"]
    status, _, err = call(
        capsys, "train", "--out", run, "--resume", "--lr", "1e-3", "--eval-interval", "7", "--max-iters", "28"
    )
    assert status == 0, err  # the run is recoverable
    assert [p.name for p in list_checkpoints(run)] == ["ckpt_0000028"]


# --- one run per folder ---------------------------------------------------------------------


def test_a_second_process_on_the_folder_fails_at_once(capsys, run):
    with run_lock(run):  # as a running `gptbook train` holds it
        before = listing(run)
        for argv in (["--resume", "--max-iters", "30"], ["--overwrite", "--max-iters", "4", *T]):
            status, _, err = call(capsys, "train", "--out", run, *argv)
            one_line_error(status, err, f"another gptbook train is using {run} (pid {os.getpid()})")
        assert listing(run) == before


def _spawn_train(out, *argv):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "gptbook", "train", "--out", str(out), *map(str, argv)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)


def _wait_for(predicate, proc, timeout=120.0, poll=0.0005):
    "Poll until `predicate()` holds; False if the process ended first (or the time ran out)."
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        if proc.poll() is not None:
            return predicate()
        time.sleep(poll)
    return False


def test_the_lock_names_the_holder_and_dies_with_it(capsys, tmp_path):
    "A real `gptbook train` holds the lock; a second one fails naming its pid; after `kill -9` nothing blocks."
    out = tmp_path / "run"
    proc = _spawn_train(out, "--max-iters", "100000", "--eval-interval", "5", *T)
    try:
        assert _wait_for(lambda: bool(list_checkpoints(out)), proc), proc.stderr.read().decode()
        status, _, err = call(capsys, "train", "--out", out, "--resume", "--max-iters", "10")
        one_line_error(status, err, f"another gptbook train is using {out} (pid {proc.pid})")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    step = load_checkpoint(out).iter
    status, _, err = call(capsys, "train", "--out", out, "--resume", "--max-iters", step + 2)
    assert status == 0, err  # the dead process's lock does not block
    assert load_checkpoint(out).iter == step + 2


# --- resume resumes what you named -----------------------------------------


def test_resume_trains_in_the_folder_named_not_the_one_recorded(capsys, base, tmp_path, monkeypatch):
    shutil.copytree(base, tmp_path / "out")  # its checkpoint records out_dir = base
    monkeypatch.chdir(tmp_path)
    before = listing(base)
    status, out, err = call(capsys, "train", "--resume", "--max-iters", "22", "--no-progress", "--sample-tokens", "0")
    assert status == 0, err
    assert [p.name for p in list_checkpoints(tmp_path / "out")] == ["ckpt_0000022"] and listing(base) == before
    assert f"checkpoint: {Path('out') / 'ckpt_0000022'}" in out


def test_a_relative_data_path_resumes_from_another_directory(capsys, tmp_path, monkeypatch, shakespeare):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.txt").write_text(shakespeare[:100_000], encoding="utf-8")
    (tmp_path / "mv").mkdir()
    monkeypatch.chdir(tmp_path)
    status, _, err = call(capsys, "train", "--out", "dch", "--data", "data/mine.txt", "--max-iters", "4", *T)
    assert status == 0, err
    monkeypatch.chdir(tmp_path / "mv")
    status, _, err = call(capsys, "train", "--out", "../dch", "--resume", "--max-iters", "6", "--no-progress")
    assert status == 0, err
    status, _, err = call(
        capsys, "train", "--out", "../dch", "--resume", "--data", "../data/mine.txt", "--max-iters", 8
    )
    assert status == 0, err  # --data is accepted on resume: the same file (its SHA-256 matches)
    assert load_checkpoint(tmp_path / "dch").iter == 8


def test_resume_tells_a_changed_a_missing_and_another_data_file_apart(capsys, tmp_path, shakespeare):
    data = tmp_path / "mine.txt"
    data.write_text(shakespeare[:50_000], encoding="utf-8")
    status, _, err = call(capsys, "train", "--out", tmp_path / "r", "--data", data, "--max-iters", "4", *T)
    assert status == 0, err
    data.write_text(shakespeare[50_000:100_000], encoding="utf-8")  # the same alphabet, another text
    status, _, err = call(capsys, "train", "--out", tmp_path / "r", "--resume", "--max-iters", "8")
    one_line_error(status, err, f"the data file {data} changed since the run started")
    other = tmp_path / "other.txt"
    other.write_text(shakespeare[200_000:250_000], encoding="utf-8")
    status, _, err = call(capsys, "train", "--out", tmp_path / "r", "--resume", "--max-iters", "8", "--data", other)
    one_line_error(status, err, "is not the run's data file")
    data.unlink()
    status, _, err = call(capsys, "train", "--out", tmp_path / "r", "--resume", "--max-iters", "8")
    one_line_error(status, err, f"the run's data file {data} is gone", "--data PATH")


def test_out_naming_a_checkpoint_folder_is_refused(capsys, run):
    for argv in (["--resume", "--max-iters", "30"], ["--overwrite", "--max-iters", "4", *T]):
        status, _, err = call(capsys, "train", "--out", run / "ckpt_0000020", *argv)
        one_line_error(status, err, "is a checkpoint folder, not a run folder", f"--out {run}")
    names = ["model.safetensors", "state.json", "tokenizer.json", "training.pt"]
    assert sorted(p.name for p in (run / "ckpt_0000020").iterdir()) == names  # no .lock planted in it


def test_resume_to_a_step_already_reached_says_so(capsys, run):
    before = listing(run)
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "5", "--sample-tokens", "0")
    assert status == 0 and "raise --max-iters to train further" in err and "step 20" in err
    assert listing(run) == before


# --- a full disk ------------------------------------------------------------------------------


FULL_DISK = {  # what each writer of a checkpoint raises when the disk fills up
    "safetensors": SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    "oserror": OSError(errno.ENOSPC, "No space left on device"),
    "training.pt": RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),  # torch.save
}


@pytest.mark.parametrize("kind", FULL_DISK)
def test_a_full_disk_while_saving_keeps_the_last_checkpoint(capsys, run, monkeypatch, kind):
    def full(*args, **kwargs):
        raise FULL_DISK[kind]

    monkeypatch.setattr(*((C.torch, "save") if kind == "training.pt" else (C, "save_model")), full)
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "30", "--eval-interval", "10")
    one_line_error(status, err, f"could not write {run / 'ckpt_0000030'}", "ckpt_0000020 is intact")
    assert "No space left" in err or "is the disk full?" in err, err
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".lock")) == [
        "ckpt_0000020",
        "config.json",
        "metrics.jsonl",
    ]  # no temporary folder left
    assert load_checkpoint(run).iter == 20


def test_a_real_full_disk_keeps_the_last_checkpoint(capsys, base, tmp_path):
    "The same on a real small tmpfs (needs root to mount it: skipped elsewhere)."
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    size = sum(p.stat().st_size for p in base.rglob("*") if p.is_file()) + 64_000  # room for less than a checkpoint
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        shutil.copytree(base, mnt / "run")
        status, _, err = call(capsys, "train", "--out", mnt / "run", "--resume", "--max-iters", "30")
        one_line_error(status, err, "o space left on device")
        assert not [p for p in (mnt / "run").iterdir() if p.name.startswith((".tmp_", ".trash_"))]
        assert load_checkpoint(mnt / "run").iter == 20
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_full_disk_when_a_fresh_run_starts_is_one_line_and_leaves_no_folder(capsys, tmp_path, monkeypatch):
    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)  # the lock's pid: the first bytes a run writes
    out = tmp_path / "fresh"
    status, _, err = call(capsys, "train", "--out", out, "--max-iters", "2", *T)
    one_line_error(status, err, f"cannot write the run folder {out}", "No space left")
    assert not out.exists()


# --- damaged and foreign files -----------------------------------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[1,2,3]", "is not a gptbook checkpoint"),
        (b'{"format": "gptbook-checkpoint", "version": 3}', "has no valid 'iter'"),
        (b'{"format": "gptbook-checkpoint", "version": 3, "iter": 20, "sha256": [1]}', "has no valid 'sha256'"),
        (b"\xff\xfe\x00garbage", "is not UTF-8"),
        (b'{"format": "gptbook-checkpoint", "version": 1}', "has format version 1"),
    ],
)
def test_damaged_or_foreign_checkpoint_files_are_one_line_errors(capsys, run, content, message):
    (run / "ckpt_0000020" / "state.json").write_bytes(content)
    for argv in (["sample", "--out", run, "--device", "cpu"], ["train", "--out", run, "--resume", "--max-iters", 30]):
        status, _, err = call(capsys, *argv)
        one_line_error(status, err, run / "ckpt_0000020" / "state.json", message)


def test_a_changed_tokenizer_file_is_one_line_naming_it(capsys, run):
    folder = run / "ckpt_0000020"
    (folder / "tokenizer.json").write_text('{"type": "char"}')
    status, _, err = call(capsys, "sample", "--out", run, "--device", "cpu")
    one_line_error(status, err, folder / "tokenizer.json", "damaged")


def test_a_torn_last_metrics_line_is_repaired_with_a_note(capsys, run):
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"iter": 40, "train_loss": 3.9')  # a crash in the middle of an append
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "30", "--eval-interval", "10")
    assert status == 0 and "removed a torn last line" in err, err
    assert [r["iter"] for r in read_metrics(run)] == [0, 10, 20, 30]


@pytest.mark.parametrize("line", [b'{"foo": 1}\n', b"[1, 2]\n", b'{"iter": 5, "val_loss": \xa9}\n'])
def test_a_foreign_metrics_line_is_one_line_naming_the_file_and_line(capsys, run, line):
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (run / "metrics.jsonl").write_bytes(lines[0] + line + b"".join(lines[1:]))
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "30")
    one_line_error(status, err, f"{run / 'metrics.jsonl'} line 2 is not a metrics record")


# --- weights and optimizer state that do not belong ------------------------------------


@pytest.fixture(scope="module")
def base64(tmp_path_factory, shakespeare_path):
    "A run of another shape (d_model 64)."
    out = tmp_path_factory.mktemp("rel64") / "base64"
    argv = ["train", "--out", str(out), "--max-iters", "10", "--eval-interval", "10", *T, "--d-model", "64"]
    assert main(argv) == 0
    return out


def test_weights_from_another_run_name_the_shapes(capsys, run, base64):
    shutil.copy(base64 / "ckpt_0000010" / "model.safetensors", run / "ckpt_0000020")
    for argv in (["sample", "--out", run, "--device", "cpu"], ["train", "--out", run, "--resume", "--max-iters", 30]):
        status, _, err = call(capsys, *argv)
        line = one_line_error(status, err, "holds the weights of another model", "come from different runs")
        assert re.search(r"is \[\d+, 64\] in the file but \[\d+, 32\] in the model", line), line


def test_optimizer_state_from_another_run_is_refused_before_any_step(capsys, run, base64):
    shutil.copy(base64 / "ckpt_0000010" / "training.pt", run / "ckpt_0000020")
    before = listing(run)
    status, out, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "30")
    line = one_line_error(status, err, "training.pt is the optimizer state of another model")
    assert re.search(r"is \[\d+, 64\] in the file", line), line
    assert "step" not in out and listing(run) == before


def test_a_model_config_edited_in_state_json_names_the_shapes(capsys, run):
    path = run / "ckpt_0000020" / "state.json"
    state = json.loads(path.read_text())
    state["model_config"]["d_model"] = 64
    path.write_text(json.dumps(state))
    status, _, err = call(capsys, "sample", "--out", run, "--device", "cpu")
    line = one_line_error(status, err, "holds the weights of another model")
    assert re.search(r"is \[\d+, 32\] in the file but \[\d+, 64\] in the model", line), line


def _rot(path: Path) -> None:
    "Overwrite bytes in the middle of a file, as bit rot would (a safetensors header, a zip directory stay valid)."
    b = bytearray(path.read_bytes())
    for i in range(len(b) // 3, 2 * len(b) // 3, 7):
        b[i] = 0xFF
    path.write_bytes(bytes(b))


@pytest.mark.parametrize("name", ["model.safetensors", "training.pt"])
def test_bit_rot_fails_the_checksum_at_load(capsys, run, name):
    _rot(run / "ckpt_0000020" / name)
    argvs = [["train", "--out", run, "--resume", "--max-iters", 30]]
    if name == "model.safetensors":
        argvs.append(["sample", "--out", run, "--device", "cpu", "--seed", "0", "--max-new-tokens", "10"])
    for argv in argvs:
        status, _, err = call(capsys, *argv)
        line = one_line_error(status, err, run / "ckpt_0000020" / name, "damaged")
        assert "mv " not in line  # there is no earlier checkpoint to suggest


# --- more one-line errors, and the seed ----------------------------------------------------------------------------


def test_keep_last_and_an_incomplete_or_damaged_newer_folder(capsys, tmp_path):
    out = tmp_path / "r"
    status, _, err = call(
        capsys, "train", "--out", out, "--max-iters", "6", "--eval-interval", "2", "--keep-last", 2, *T
    )
    assert status == 0, err
    assert [p.name for p in list_checkpoints(out)] == ["ckpt_0000004", "ckpt_0000006"]
    assert TrainConfig(keep_last=3).keep_last == 3
    _rot(out / "ckpt_0000006" / "model.safetensors")  # an earlier checkpoint exists now: the error names it
    status, _, err = call(capsys, "sample", "--out", out / "ckpt_0000006", "--device", "cpu")
    one_line_error(status, err, "SHA-256 differs", f"mv {out / 'ckpt_0000006'}", f"to use {out / 'ckpt_0000004'}")
    status, _, err = call(capsys, "train", "--out", out, "--resume", "--max-iters", "8", "--eval-interval", "2")
    one_line_error(status, err, "SHA-256 differs", f"mv {out / 'ckpt_0000006'}")  # the advice works for a resume too
    os.rename(out / "ckpt_0000006", out / "damaged_ckpt_0000006")  # following it
    (out / "ckpt_0000099").mkdir()  # an incomplete newer folder (no state.json)
    (out / "ckpt_0000099" / "model.safetensors").write_text("")
    status, text, err = call(capsys, "sample", "--out", out, "--device", "cpu", "--max-new-tokens", "5")
    assert status == 0 and "skipped incomplete ckpt_0000099; using ckpt_0000004" in err, err
    status, _, err = call(capsys, "train", "--out", out, "--resume", "--max-iters", "8", "--eval-interval", "2")
    assert status == 0, err
    assert [p.name for p in list_checkpoints(out)] == ["ckpt_0000006", "ckpt_0000008"]
    assert (out / "damaged_ckpt_0000006").is_dir()  # what the user set aside is theirs


def test_an_unwritable_out_is_one_line_before_any_work(capsys, tmp_path):
    (tmp_path / "afile").write_text("hi")
    status, out, err = call(capsys, "train", "--out", tmp_path / "afile", "--max-iters", "4", *T)
    one_line_error(status, err, f"cannot write the run folder {tmp_path / 'afile'} (it is a file, not a folder)")
    assert out == "" and (tmp_path / "afile").read_text() == "hi"  # nothing ran: no step-0 evaluation
    if os.geteuid() != 0:  # root may write anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        status, out, err = call(capsys, "train", "--out", tmp_path / "ro", "--max-iters", "4", *T)
        one_line_error(status, err, f"cannot write the run folder {tmp_path / 'ro'}")


def test_an_overflowing_seed_names_the_flag(capsys, base):
    status, _, err = call(capsys, "train", "--out", "unused", "--seed", str(10**23))
    one_line_error(status, err, "--seed: seed must be in [0, 4294967295]")
    status, _, err = call(capsys, "sample", "--out", base, "--seed", str(10**23))
    one_line_error(status, err, "--seed must be between 0 and 2**32 - 1")


def test_a_run_folder_named_like_a_checkpoint_folder_samples_and_resumes(capsys, tmp_path):
    out = tmp_path / "ckpt_2024"
    status, _, err = call(capsys, "train", "--out", out, "--max-iters", "2", "--eval-interval", "2", *T)
    assert status == 0, err
    status, text, err = call(capsys, "sample", out, "--device", "cpu", "--max-new-tokens", "5", "--seed", "0")
    assert status == 0 and text.strip(), err
    status, _, err = call(capsys, "train", "--out", out, "--resume", "--max-iters", "4", "--no-progress")
    assert status == 0, err
    assert load_checkpoint(out).path == out / "ckpt_0000004"


def test_sample_needs_only_the_weights_state_and_tokenizer(capsys, run):
    (run / "ckpt_0000020" / "training.pt").unlink()
    status, out, err = call(capsys, "sample", "--out", run, "--device", "cpu", "--max-new-tokens", "5", "--seed", "0")
    assert status == 0 and out.strip(), err


def test_a_tokenizer_of_another_run_is_refused_at_load(capsys, run):
    folder = run / "ckpt_0000020"
    CharTokenizer.train("ab").save(folder / "tokenizer.json")
    state = json.loads((folder / "state.json").read_text())
    state["sha256"]["tokenizer.json"] = C.sha256_of(folder / "tokenizer.json")  # consistent, but another run's
    (folder / "state.json").write_text(json.dumps(state))
    status, _, err = call(capsys, "sample", "--out", run, "--device", "cpu")
    one_line_error(status, err, folder / "tokenizer.json", "has 2 ids", "trained with 65")


def test_the_seed_also_seeds_numpy_and_python(capsys, tmp_path):
    for name in ("a", "b"):
        random.random()  # whatever ran before must not matter
        status, _, err = call(capsys, "train", "--out", tmp_path / name, "--max-iters", "2", "--eval-interval", "2", *T)
        assert status == 0, err
    a, b = (torch.load(tmp_path / n / "ckpt_0000002" / "training.pt", weights_only=True)["rng"] for n in ("a", "b"))
    assert torch.equal(a["numpy"][1], b["numpy"][1]) and a["python"] == b["python"]


# --- the lock: races and links ------------------------------------------------------------------------------


def _take_lock(folder, barrier, results):
    barrier.wait()
    try:
        with run_lock(folder):
            time.sleep(0.3)  # the winner loads its data: nothing written yet
            results.put(("won", (Path(folder) / ".lock").exists()))
    except RunLocked:
        results.put(("lost", None))


def test_two_runs_starting_on_a_new_folder_never_share_it(tmp_path):
    "The loser of a start race never removes the winner's lock (the review's lockrace.py, 40 trials)."
    ctx = multiprocessing.get_context("fork")
    for trial in range(40):
        folder, barrier, results = tmp_path / f"race_{trial}", ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_take_lock, args=(folder, barrier, results)) for _ in range(2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=60)
        outcomes = sorted([results.get(timeout=10), results.get(timeout=10)], key=str)
        assert outcomes[1] == ("won", True), (trial, outcomes)  # the winner still had its lock on disk
        assert outcomes[0] == ("lost", None) or outcomes[0] == ("won", True), (trial, outcomes)  # one after another


def test_a_lock_that_is_a_link_is_refused_not_followed(capsys, run, tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("precious data")
    (run / ".lock").unlink(missing_ok=True)
    (run / ".lock").symlink_to(precious)
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "30")
    one_line_error(status, err, f"cannot write the run folder {run}", ".lock is a symbolic link")
    assert precious.read_text() == "precious data"
    (run / ".lock").unlink()
    (run / ".lock").mkdir()
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "30")
    one_line_error(status, err, ".lock is a folder")


# --- the kill -9 campaigns ----------------------------------------------------------------------------------

STEPS = 80
CAMPAIGN = ["--max-iters", str(STEPS), "--eval-interval", "1", "--eval-iters", "1", "--dropout", "0.1", "--seed", "7"]


def _same_run_state(a: Path, b: Path) -> bool:
    "The weights, the optimizer's state and every random state of two checkpoints are equal, tensor for tensor."
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    ta, tb = (torch.load(f / "training.pt", weights_only=True) for f in (a, b))
    same_opt = all(
        torch.equal(v, tb["optimizer"]["state"][i][k])
        for i, s in ta["optimizer"]["state"].items()
        for k, v in s.items()
    )
    same_rng = torch.equal(ta["rng"]["torch"], tb["rng"]["torch"]) and torch.equal(
        ta["rng"]["batches"], tb["rng"]["batches"]
    )
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa) and same_opt and same_rng


def _kill_once(out: Path, proc, inside_save: bool, rng: random.Random) -> tuple[bool, bool] | None:
    """Kill `proc` with SIGKILL, inside a save (once a .tmp_ folder exists) or at a random moment.

    Returns (whether the moment was inside a save, whether the kill left a temporary folder), or None if the
    process ended first."""
    start = C.latest_checkpoint(out).name if list_checkpoints(out) else None

    def progressed():
        ckpts = list_checkpoints(out)
        return bool(ckpts) and ckpts[-1].name != start

    if not _wait_for(progressed, proc):  # at least one new checkpoint per life: the campaign advances
        return None
    if inside_save:
        found = _wait_for(lambda: any(p.name.startswith(".tmp_ckpt_") for p in out.iterdir()), proc, timeout=20)
    else:
        time.sleep(rng.uniform(0, 0.1))
        found = False
    if proc.poll() is not None:
        return None
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return found, any(p.name.startswith((".tmp_ckpt_", ".trash_")) for p in out.iterdir())


@pytest.mark.slow
def test_kill9_campaign_resumes_bit_exactly(tmp_path, shakespeare_path):
    "At least 10 kill -9 of a real `gptbook train` (half inside saves); after each a load check and --resume."
    ref = tmp_path / "ref"
    proc = _spawn_train(ref, *CAMPAIGN, *T)
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    out, rng = tmp_path / "killed", random.Random(0)
    figures = dict.fromkeys(["kills", "kills inside saves", "kills that left a temporary folder", "resumes"], 0)
    proc = _spawn_train(out, *CAMPAIGN, *T)
    while True:
        killed = _kill_once(out, proc, figures["kills"] % 2 == 1, rng)
        if killed is None:
            break
        figures["kills"] += 1
        figures["kills inside saves"] += killed[0]
        figures["kills that left a temporary folder"] += killed[1]
        ck = load_checkpoint(out)  # the latest checkpoint loads, with its checksums
        proc = _spawn_train(out, "--resume", "--no-progress", "--sample-tokens", "0")
        figures["resumes"] += 1
        if figures["kills"] >= 12 or ck.iter >= STEPS - 2:
            break
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    final_ref, final = list_checkpoints(ref)[-1], list_checkpoints(out)[-1]
    assert final.name == final_ref.name == f"ckpt_{STEPS:07d}"

    def losses(run):
        return [(r["iter"], r["train_loss"], r["val_loss"], r["grad_norm"]) for r in read_metrics(run)]

    figures["bit-exact"] = _same_run_state(final_ref, final) and losses(ref) == losses(out)
    figures["leftovers"] = [p.name for p in out.iterdir() if p.name.startswith((".tmp_", ".trash_"))]
    print("\nkill -9 campaign:", ", ".join(f"{k} {v}" for k, v in figures.items()))
    assert figures["kills"] >= 10 and figures["kills inside saves"] >= 5, figures
    assert figures["bit-exact"] and not figures["leftovers"], figures


# The --overwrite switch-over, slowed down so that kills land inside each of its windows: the staged new run
# before its commit, the rename, and the moves after it.
_SLOW_SWITCH = """
import os, sys, time
import gptbook.runs as R
real_rename, real_replace, real_remove = os.rename, os.replace, R.remove_dir
def slow(f):
    def g(*a, **k):
        time.sleep(0.4)
        return f(*a, **k)
    return g
R.os.rename, R.os.replace, R.remove_dir = slow(real_rename), slow(real_replace), slow(real_remove)
from gptbook.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _spawn_slow_switch(out, *argv):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", _SLOW_SWITCH, "train", "--out", str(out), *map(str, argv)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)


def _which_run(out: Path, seeds: tuple[int, int]) -> int:
    "The seed of the one run the folder holds; fails if its checkpoints, config or metrics mix the two."
    seen = {json.loads((p / "state.json").read_text())["train_config"]["seed"] for p in list_checkpoints(out)}
    seen.add(json.loads((out / "config.json").read_text())["train_config"]["seed"])
    assert len(seen) == 1 and seen <= set(seeds), seen
    return seen.pop()


class _Killed(BaseException):
    "A kill -9, in this process: nothing after it runs, no handler catches it."


def test_a_switch_finished_after_a_kill_keeps_the_new_runs_metrics_and_config(capsys, run, monkeypatch):
    "A kill once the new run's metrics and config moved in, before its checkpoint did: the next start keeps them."

    def killed_half_way(run_dir):
        for old in list_checkpoints(run_dir):
            shutil.rmtree(old)
        for name in ("metrics.jsonl", "config.json"):
            os.replace(run_dir / ".replacing" / name, run_dir / name)
        raise _Killed

    overwrite = ["--overwrite", "--seed", "5", "--max-iters", "8", "--eval-interval", "4", *T]
    with monkeypatch.context() as m, pytest.raises(_Killed):
        m.setattr(R, "_move_in", killed_half_way)
        call(capsys, "train", "--out", run, *overwrite)
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "12", "--no-progress")
    assert status == 0, err
    assert _which_run(run, (1337, 5)) == 5
    assert [r["iter"] for r in read_metrics(run)] == [0, 4, 8, 12]


@pytest.mark.slow
def test_a_kill_at_any_point_of_the_overwrite_switch_leaves_one_whole_run(capsys, base, tmp_path):
    "Kills before the commit leave the old run, after it the new one; the next start finishes a switch it finds."
    old_metrics = read_metrics(base)
    ow = ["--overwrite", "--seed", "5", "--max-iters", "8", "--eval-interval", "4", *T]
    windows = {
        "staged, before the commit": lambda out: list_checkpoints(out / ".new_run"),
        "committed, before the moves": lambda out: (out / ".replacing").is_dir(),
        "half moved": lambda out: (out / ".replacing").is_dir() and not list_checkpoints(out),  # old ones gone
    }
    outcomes = {}
    for name, moment in windows.items():
        out = tmp_path / name.replace(" ", "_").replace(",", "")
        shutil.copytree(base, out)
        proc = _spawn_slow_switch(out, *ow)
        assert _wait_for(functools.partial(moment, out), proc, timeout=300), (name, proc.stderr.read().decode())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        status, _, err = call(capsys, "train", "--out", out, "--resume", "--max-iters", "12", "--no-progress")
        assert status == 0, (name, err)
        seed = _which_run(out, (1337, 5))
        records = read_metrics(out)
        if seed == 1337:  # the old run continued, its records intact
            assert records[: len(old_metrics)] == old_metrics, name
        else:  # the new run continued from its first checkpoint, with its own records only
            assert records[0]["iter"] == 0 and records[0]["val_loss"] != old_metrics[0]["val_loss"], name
        outcomes[name] = seed
    print("\n--overwrite kills:", outcomes)
    assert outcomes == {"staged, before the commit": 1337, "committed, before the moves": 5, "half moved": 5}


@pytest.mark.slow
def test_two_commands_racing_for_a_new_folder_train_one_run(tmp_path):
    "Several `gptbook train` started at once on one new folder: one trains, the others refuse; no mixed run."
    for trial in range(3):
        out = tmp_path / f"race_{trial}"
        procs = [
            _spawn_train(out, "--max-iters", "6", "--eval-interval", "2", "--seed", str(seed), *T) for seed in (1, 2, 3)
        ]
        codes = [p.wait(timeout=300) for p in procs]
        errors = [p.stderr.read().decode() for p in procs]
        assert sorted(codes) == [0, 1, 1], (codes, errors)
        refused = [e for c, e in zip(codes, errors) if c == 1]
        assert all("another gptbook train is using" in e or "holds a run" in e for e in refused), refused
        assert [r["iter"] for r in read_metrics(out)] == [0, 2, 4, 6]
        _which_run(out, (1, 2, 3))


def test_init_from_a_hub_name_reads_model_and_tokenizer_from_one_snapshot(tmp_path, monkeypatch):
    "F4: --init-from gpt2 looks the name up once, and the weights and the tokenizer come from that snapshot."
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from gptbook.hf import save_hf
    from gptbook.model import GPT, GPTConfig
    from gptbook.tokenizer import GPT2_PATTERN, BPETokenizer

    text = "To be, or not to be, that is the question: whether 'tis nobler in the mind. " * 20
    tok = BPETokenizer.train(text, 280, GPT2_PATTERN)
    torch.manual_seed(0)
    model = GPT(GPTConfig.baby(tok.vocab_size, n_layers=1, n_heads=2, d_model=32, max_seq_len=16))
    save_hf(model, tmp_path / "snapshot", tok)
    lookups = []

    def fake_snapshot_download(repo_id, allow_patterns):
        lookups.append(repo_id)
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.chdir(tmp_path)  # no folder named gpt2 here
    init = R.pretrained("gpt2", {"dropout": 0.1})
    assert lookups == ["gpt2"] and init.path == (tmp_path / "snapshot").resolve()
    assert init.config == model.config.replace(dropout=0.1)
    assert torch.equal(init.weights["wte.weight"], model.wte.weight)
    assert init.tokenizer.encode(text) == tok.encode(text)
    with pytest.raises(ValueError, match="its n_layers is 1, not 2; drop --n-layers"):
        R.pretrained("gpt2", {"n_layers": 2})
