"""Runs you cannot lose (issue 12): one test per finding of the reliability review (../shared/reviews/reliability.md)
that belongs to the trainer, the checkpoints and the CLI, each reproducing the review's case, and the kill -9
campaign. Test names carry the finding: test_d1_... for D1, test_w2_... for W2."""

import errno
import json
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
from gptbook.checkpoint import CKPT_FILES, list_checkpoints, run_lock
from gptbook.cli import main
from gptbook.tokenizer import CharTokenizer
from gptbook.train import TrainConfig, load_checkpoint, read_metrics

ROOT = Path(__file__).resolve().parents[1]
T = ["--eval-iters", "2", "--n-layers", "1", "--d-model", "32", "--n-heads", "2", "--device", "cpu", "--no-progress"]
T += ["--sample-tokens", "0", "--max-seq-len", "32", "--batch-size", "4"]

from test_cli import call  # noqa: E402  (run `gptbook *argv` in this process: one helper for both files)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def one_line_error(status, err, *texts):
    "The command failed with exit status 1 and a single line of stderr that holds every one of `texts`."
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("note:")]
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


# --- D1 / W1: a fresh run never destroys an earlier one ----------------------------------------


def test_w1_fresh_run_on_a_run_folder_refuses_without_overwrite(capsys, run):
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
def test_d1_a_fresh_run_that_cannot_start_leaves_the_earlier_run_whole(capsys, run, tmp_path, bad, message):
    short = tmp_path / "short.txt"
    short.write_text(Path(os.environ["GPTBOOK_DATA"]).read_text(encoding="utf-8")[:50], encoding="utf-8")
    before = listing(run)
    argv = [str(short) if a == "SHORT" else a for a in bad]
    status, _, err = call(capsys, "train", "--out", run, "--overwrite", "--max-iters", "4", *T, *argv)
    one_line_error(status, err, message)
    assert listing(run) == before and load_checkpoint(run).iter == 20


def test_w1_overwrite_replaces_the_old_run_only_after_the_first_checkpoint(capsys, run):
    old_metrics = (run / "metrics.jsonl").read_bytes()
    # a replacing run that diverges before its first checkpoint: the old run is still all there
    status, _, err = call(
        capsys, "train", "--out", run, "--overwrite", "--lr", "1e6", "--warmup-iters", "0", "--eval-interval", "1", *T
    )
    one_line_error(status, err, "step 1 was not saved", "No checkpoint of this run was saved yet")
    assert [p.name for p in list_checkpoints(run)] == ["ckpt_0000020"]
    assert (run / "metrics.jsonl").read_bytes() == old_metrics
    # a replacing run that saves: only its own checkpoint, metrics and config remain
    status, _, _ = call(capsys, "train", "--out", run, "--overwrite", "--max-iters", "6", "--eval-interval", "3", *T)
    assert status == 0
    assert [p.name for p in list_checkpoints(run)] == ["ckpt_0000006"]
    assert [r["iter"] for r in read_metrics(run)] == [0, 3, 6]
    assert json.loads((run / "config.json").read_text())["train_config"]["max_iters"] == 6


def test_w1_a_folder_whose_run_saved_no_checkpoint_needs_no_overwrite(capsys, tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"iter": 0, "train_loss": 4.2, "val_loss": 4.2}\n')  # killed before a save
    (out / "config.json").write_text("{}")
    status, _, err = call(capsys, "train", "--out", out, "--max-iters", "4", "--eval-interval", "2", *T)
    assert status == 0, err
    assert [r["iter"] for r in read_metrics(out)] == [0, 2, 4] and load_checkpoint(out).iter == 4


# --- D2: a diverged evaluation is never saved ---------------------------------------------------


@pytest.mark.parametrize("lr", ["1e30", "1e6"])  # NaN, and the review's exploded val loss (4.8e11)
def test_d2_a_diverged_evaluation_never_replaces_the_last_good_checkpoint(capsys, run, lr):
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


# --- D3: one run per folder ---------------------------------------------------------------------


def test_d3_a_second_process_on_the_folder_fails_at_once(capsys, run):
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


def test_d3_the_lock_names_the_holder_and_dies_with_it(capsys, tmp_path):
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


# --- D4, D5, D12, W7, W14: resume resumes what you named -----------------------------------------


def test_d4_resume_without_out_trains_in_out_not_in_the_recorded_folder(capsys, base, tmp_path, monkeypatch):
    shutil.copytree(base, tmp_path / "out")  # its checkpoint records out_dir = base
    monkeypatch.chdir(tmp_path)
    before = listing(base)
    status, out, err = call(capsys, "train", "--resume", "--max-iters", "22", "--no-progress", "--sample-tokens", "0")
    assert status == 0, err
    assert [p.name for p in list_checkpoints(tmp_path / "out")] == ["ckpt_0000022"] and listing(base) == before
    assert f"checkpoint: {Path('out') / 'ckpt_0000022'}" in out


def test_d5_a_relative_data_path_resumes_from_another_directory(capsys, tmp_path, monkeypatch, shakespeare):
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


def test_w7_resume_names_a_changed_or_missing_data_file(capsys, tmp_path, shakespeare):
    data = tmp_path / "mine.txt"
    data.write_text(shakespeare[:50_000], encoding="utf-8")
    status, _, err = call(capsys, "train", "--out", tmp_path / "r", "--data", data, "--max-iters", "4", *T)
    assert status == 0, err
    data.write_text(shakespeare[50_000:100_000], encoding="utf-8")  # the same alphabet, another text
    status, _, err = call(capsys, "train", "--out", tmp_path / "r", "--resume", "--max-iters", "8")
    one_line_error(status, err, f"the data file {data} changed since the run started")
    data.unlink()
    status, _, err = call(capsys, "train", "--out", tmp_path / "r", "--resume", "--max-iters", "8")
    one_line_error(status, err, f"the run's data file {data} is gone", "--data PATH")


def test_d12_out_pointing_at_a_checkpoint_folder_is_refused(capsys, run):
    for argv in (["--resume", "--max-iters", "30"], ["--overwrite", "--max-iters", "4", *T]):
        status, _, err = call(capsys, "train", "--out", run / "ckpt_0000020", *argv)
        one_line_error(status, err, "is a checkpoint folder, not a run folder", f"--out {run}")
    assert sorted(p.name for p in (run / "ckpt_0000020").iterdir()) == sorted([*CKPT_FILES, "tokenizer.json"])


def test_w14_resume_to_a_step_already_reached_says_nothing_was_trained(capsys, run):
    before = listing(run)
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "5", "--sample-tokens", "0")
    assert status == 0 and "nothing was trained" in err and "step 20" in err
    assert listing(run) == before


# --- D6: a full disk ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["safetensors", "oserror"])
def test_d6_a_full_disk_while_saving_is_one_line_and_keeps_the_last_checkpoint(capsys, run, monkeypatch, kind):
    def full(*args, **kwargs):
        if kind == "safetensors":
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(C, "save_file", full)
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "30", "--eval-interval", "10")
    one_line_error(status, err, f"no space left on device while writing {run / 'ckpt_0000030'}", "MB")
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".lock")) == [
        "ckpt_0000020",
        "config.json",
        "metrics.jsonl",
    ]  # no temporary folder left
    assert load_checkpoint(run).iter == 20


def test_d6_a_real_full_disk_keeps_the_last_checkpoint(capsys, base, tmp_path):
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


# --- D7: damaged and foreign files -----------------------------------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[1,2,3]", "is not a gptbook checkpoint"),
        (b'{"format": "gptbook-checkpoint"}', "has no valid step"),
        (b'{"format": "gptbook-checkpoint", "iter": 20, "rng": [1]}', '"rng" that is a list'),
        (b"\xff\xfe\x00garbage", "is not valid JSON"),
    ],
)
def test_d7_a_state_json_that_parses_wrongly_is_one_line_naming_it(capsys, run, content, message):
    (run / "ckpt_0000020" / "state.json").write_bytes(content)
    for argv in (["sample", "--out", run, "--device", "cpu"], ["train", "--out", run, "--resume", "--max-iters", 30]):
        status, _, err = call(capsys, *argv)
        one_line_error(status, err, run / "ckpt_0000020" / "state.json", message)


def test_d7_a_tokenizer_json_without_its_fields_is_one_line_naming_it(capsys, run):
    folder = run / "ckpt_0000020"
    (folder / "tokenizer.json").write_text('{"type": "char"}')
    status, _, err = call(capsys, "sample", "--out", run, "--device", "cpu")
    one_line_error(status, err, folder / "tokenizer.json", "damaged")
    state = json.loads((folder / "state.json").read_text())
    del state["sha256"]["tokenizer.json"]  # no checksum to catch it: the reader itself must
    (folder / "state.json").write_text(json.dumps(state))
    status, _, err = call(capsys, "sample", "--out", run, "--device", "cpu")
    one_line_error(status, err, folder / "tokenizer.json", "is not a tokenizer gptbook can read")


def test_d7_a_torn_last_metrics_line_is_repaired_with_a_note(capsys, run):
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"iter": 40, "train_loss": 3.9')  # a crash in the middle of an append
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "30", "--eval-interval", "10")
    assert status == 0 and "removed a torn last line" in err, err
    assert [r["iter"] for r in read_metrics(run)] == [0, 10, 20, 30]


@pytest.mark.parametrize("line", [b'{"foo": 1}\n', b"[1, 2]\n", b'{"iter": 5, "val_loss": \xa9}\n'])
def test_d7_a_foreign_metrics_line_is_one_line_naming_the_file_and_line(capsys, run, line):
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (run / "metrics.jsonl").write_bytes(lines[0] + line + b"".join(lines[1:]))
    status, _, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "30")
    one_line_error(status, err, f"{run / 'metrics.jsonl'} line 2 is not a metrics record")


# --- D8, D10: weights and optimizer state that do not belong ------------------------------------


@pytest.fixture(scope="module")
def base64(tmp_path_factory, shakespeare_path):
    "A run of another shape (d_model 64)."
    out = tmp_path_factory.mktemp("rel64") / "base64"
    argv = ["train", "--out", str(out), "--max-iters", "10", "--eval-interval", "10", *T, "--d-model", "64"]
    assert main(argv) == 0
    return out


def test_d8_weights_from_another_config_name_the_shapes(capsys, run, base64):
    shutil.copy(base64 / "ckpt_0000010" / "model.safetensors", run / "ckpt_0000020")
    for argv in (["sample", "--out", run, "--device", "cpu"], ["train", "--out", run, "--resume", "--max-iters", 30]):
        status, _, err = call(capsys, *argv)
        line = one_line_error(status, err, "holds the weights of another model", "come from different runs")
        assert re.search(r"is \[\d+, 64\] in the file but \[\d+, 32\] in the model", line), line


def test_d8_optimizer_state_from_another_config_is_refused_before_any_step(capsys, run, base64):
    shutil.copy(base64 / "ckpt_0000010" / "optimizer.safetensors", run / "ckpt_0000020")
    before = listing(run)
    status, out, err = call(capsys, "train", "--out", run, "--resume", "--max-iters", "30")
    line = one_line_error(status, err, "optimizer.safetensors is the optimizer state of another model")
    assert re.search(r"is \[\d+, 64\] in the file but the parameter is \[\d+, 32\]", line), line
    assert "step" not in out and listing(run) == before


def test_d8_a_model_config_edited_in_state_json_names_the_shapes(capsys, run):
    path = run / "ckpt_0000020" / "state.json"
    state = json.loads(path.read_text())
    state["model_config"]["d_model"] = 64
    path.write_text(json.dumps(state))
    status, _, err = call(capsys, "sample", "--out", run, "--device", "cpu")
    line = one_line_error(status, err, "holds the weights of another model")
    assert re.search(r"is \[\d+, 32\] in the file but \[\d+, 64\] in the model", line), line


def _rot(path: Path) -> None:
    "Overwrite bytes inside the tensor data of a safetensors file, as bit rot would (the header stays valid)."
    b = bytearray(path.read_bytes())
    n = int.from_bytes(b[:8], "little")
    for i in range(8 + n + 100, min(len(b), 8 + n + 60000), 7):
        b[i] = 0xFF
    path.write_bytes(bytes(b))


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors", "rng.safetensors"])
def test_d10_a_corrupted_tensor_file_fails_its_checksum_at_load(capsys, run, name):
    _rot(run / "ckpt_0000020" / name)
    argvs = [["train", "--out", run, "--resume", "--max-iters", 30]]
    if name == "model.safetensors":
        argvs.append(["sample", "--out", run, "--device", "cpu", "--seed", "0", "--max-new-tokens", "10"])
    for argv in argvs:
        status, _, err = call(capsys, *argv)
        line = one_line_error(status, err, run / "ckpt_0000020" / name, "SHA-256 differs")
        assert "earlier checkpoint" not in line  # W2: there is none to suggest


# --- W2, W3, W4, W6, W15 ----------------------------------------------------------------------------


def test_w2_keep_last_and_an_incomplete_newer_folder(capsys, tmp_path):
    out = tmp_path / "r"
    status, _, err = call(
        capsys, "train", "--out", out, "--max-iters", "6", "--eval-interval", "2", "--keep-last", 2, *T
    )
    assert status == 0, err
    assert [p.name for p in list_checkpoints(out)] == ["ckpt_0000004", "ckpt_0000006"]
    assert TrainConfig(keep_last=3).keep_last == 3
    _rot(out / "ckpt_0000006" / "model.safetensors")  # an earlier checkpoint exists now: the error names it
    status, _, err = call(capsys, "sample", "--out", out / "ckpt_0000006", "--device", "cpu")
    one_line_error(status, err, "SHA-256 differs", f"use the earlier checkpoint {out / 'ckpt_0000004'}")
    shutil.rmtree(out / "ckpt_0000006")
    (out / "ckpt_0000099").mkdir()  # an incomplete newer folder
    (out / "ckpt_0000099" / "state.json").write_text("{}")
    status, text, err = call(capsys, "sample", "--out", out, "--device", "cpu", "--max-new-tokens", "5")
    assert status == 0 and "skipped incomplete ckpt_0000099; using ckpt_0000004" in err, err
    status, _, err = call(capsys, "train", "--out", out, "--resume", "--max-iters", "8", "--eval-interval", "2")
    assert status == 0, err
    assert [p.name for p in list_checkpoints(out)] == ["ckpt_0000006", "ckpt_0000008"]


def test_w3_an_unwritable_out_is_one_line_before_any_work(capsys, tmp_path):
    (tmp_path / "afile").write_text("hi")
    status, out, err = call(capsys, "train", "--out", tmp_path / "afile", "--max-iters", "4", *T)
    one_line_error(status, err, f"cannot write the run folder {tmp_path / 'afile'} (it is a file, not a folder)")
    assert out == "" and (tmp_path / "afile").read_text() == "hi"  # nothing ran: no step-0 evaluation
    if os.geteuid() != 0:  # root may write anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        status, out, err = call(capsys, "train", "--out", tmp_path / "ro", "--max-iters", "4", *T)
        one_line_error(status, err, f"cannot write the run folder {tmp_path / 'ro'}")


def test_w4_an_overflowing_seed_names_the_flag(capsys, base):
    status, _, err = call(capsys, "train", "--out", "unused", "--seed", str(10**23))
    one_line_error(status, err, "--seed: seed must be in [0, 4294967295]")
    status, _, err = call(capsys, "sample", "--out", base, "--seed", str(10**23))
    one_line_error(status, err, "--seed must be between 0 and 2**32 - 1")


def test_w6_sample_needs_only_the_weights_state_and_tokenizer(capsys, run):
    for name in ("optimizer.safetensors", "rng.safetensors"):
        (run / "ckpt_0000020" / name).unlink()
    status, out, err = call(capsys, "sample", "--out", run, "--device", "cpu", "--max-new-tokens", "5", "--seed", "0")
    assert status == 0 and out.strip(), err


def test_w6_a_tokenizer_of_another_vocabulary_is_refused_at_load(capsys, run):
    folder = run / "ckpt_0000020"
    CharTokenizer.train("ab").save(folder / "tokenizer.json")
    state = json.loads((folder / "state.json").read_text())
    del state["sha256"]["tokenizer.json"]  # a consistent checkpoint whose tokenizer is another run's
    (folder / "state.json").write_text(json.dumps(state))
    status, _, err = call(capsys, "sample", "--out", run, "--device", "cpu")
    one_line_error(status, err, folder / "tokenizer.json", "has 2 ids", "trained with 65")


def test_w15_the_seed_also_seeds_numpy_and_python(capsys, tmp_path):
    for name in ("a", "b"):
        random.random()  # whatever ran before must not matter
        status, _, err = call(capsys, "train", "--out", tmp_path / name, "--max-iters", "2", "--eval-interval", "2", *T)
        assert status == 0, err
    a, b = (load_file(tmp_path / n / "ckpt_0000002" / "rng.safetensors") for n in ("a", "b"))
    assert torch.equal(a["numpy_keys"], b["numpy_keys"])
    sa, sb = (json.loads((tmp_path / n / "ckpt_0000002" / "state.json").read_text())["rng"] for n in ("a", "b"))
    assert sa == sb


# --- the kill -9 campaign ----------------------------------------------------------------------------------

STEPS = 80
CAMPAIGN = ["--max-iters", str(STEPS), "--eval-interval", "1", "--eval-iters", "1", "--dropout", "0.1", "--seed", "7"]


def _tensors_equal(a: Path, b: Path) -> bool:
    ta, tb = load_file(a), load_file(b)
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def _kill_once(out: Path, proc, inside_save: bool, rng: random.Random) -> tuple[bool, bool] | None:
    """Kill `proc` with SIGKILL, inside a save (once a .tmp_ folder exists) or at a random moment.

    Returns (whether the moment was inside a save, whether the kill left a temporary folder), or None if the
    process ended first."""
    start = C.find_checkpoint(out).name if list_checkpoints(out) else None

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
    figures["loads after a kill"] = 0
    proc = _spawn_train(out, *CAMPAIGN, *T)
    while True:
        killed = _kill_once(out, proc, figures["kills"] % 2 == 1, rng)
        if killed is None:
            break
        figures["kills"] += 1
        figures["kills inside saves"] += killed[0]
        figures["kills that left a temporary folder"] += killed[1]
        ck = load_checkpoint(out)  # the latest checkpoint loads, and every ckpt_* folder is complete
        assert all((p / f).is_file() for p in C.checkpoint_dirs(out) for f in CKPT_FILES)
        figures["loads after a kill"] += 1
        if figures["kills"] >= 12 or ck.iter >= STEPS - 2:
            proc = _spawn_train(out, "--resume", "--no-progress", "--sample-tokens", "0")
            figures["resumes"] += 1
            break
        proc = _spawn_train(out, "--resume", "--no-progress", "--sample-tokens", "0")
        figures["resumes"] += 1
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    final_ref, final = list_checkpoints(ref)[-1], list_checkpoints(out)[-1]
    assert final.name == final_ref.name == f"ckpt_{STEPS:07d}"
    exact = all(_tensors_equal(final_ref / f, final / f) for f in ("model.safetensors", "optimizer.safetensors"))

    def losses(run):
        return [(r["iter"], r["train_loss"], r["val_loss"]) for r in read_metrics(run)]

    figures["bit-exact"] = exact and losses(ref) == losses(out)
    print("\nkill -9 campaign:", ", ".join(f"{k} {v}" for k, v in figures.items()))
    assert figures["kills"] >= 10 and figures["kills inside saves"] >= 5, figures
    assert figures["bit-exact"], figures
