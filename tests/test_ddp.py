"""DistributedDataParallel through torchrun: 2 CPU processes (gloo) train exactly like 1 process with the
same global batch.

Why they can agree: every process draws the offsets of the whole global batch from an identically seeded
generator and keeps its slice (`get_batch`), DDP averages the gradients, and the logged losses are averaged
over processes. What remains is the order of floating-point additions (a batch of 8 in one matmul versus
two halves whose gradients are summed by an all-reduce), so we allow 1e-4 on losses and 1e-4 on weights:
float32 rounding is ~1e-7 relative per operation, and 12 steps of AdamW amplify it a little (measured here:
losses within 3e-7, weights within 3e-6), while a real mistake (a wrong slice, a missing average, gradients
synced or scaled wrongly under accumulation, half the global batch) moves the losses by 1e-2 or more.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptbook.checkpoint import load_checkpoint
from gptbook.runs import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4
COMMON = [
    "train",
    "--n-layers",
    "2",
    "--n-heads",
    "2",
    "--d-model",
    "32",
    "--max-seq-len",
    "32",
    "--dropout",
    "0",
    "--max-iters",
    "12",
    "--eval-interval",
    "4",
    "--eval-iters",
    "2",
    "--lr",
    "3e-3",
    "--warmup-iters",
    "3",
    "--device",
    "cpu",
    "--no-progress",
    "--sample-tokens",
    "0",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


@pytest.mark.slow
def test_two_processes_equal_one_with_the_same_global_batch(tmp_path, shakespeare_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, "-m", "gptbook", *COMMON, "--batch-size", "8", "--out", str(one)])
    # 2 processes x 2 accumulated micro-batches x 2 sequences = the same 8 sequences per step;
    # grad-accum 2 exercises no_sync on the first micro-step
    r = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            "-m",
            "gptbook",
            *COMMON,
            "--batch-size",
            "2",
            "--grad-accum",
            "2",
            "--out",
            str(two),
        ]
    )
    assert r.stdout.count("step 12: train loss") == 1, "only rank 0 prints"
    assert r.stdout.count("done in ") == 1, "only rank 0 prints the closing summary"

    m1, m2 = read_metrics(one), read_metrics(two)
    assert [r["iter"] for r in m1] == [r["iter"] for r in m2] == [0, 4, 8, 12]
    for a, b in zip(m1, m2):
        assert abs(a["train_loss"] - b["train_loss"]) < TOL and abs(a["val_loss"] - b["val_loss"]) < TOL, (a, b)
        assert a["lr"] == b["lr"]
    assert m1[-1]["val_loss"] < m1[0]["val_loss"] - 0.1  # the runs did learn: the comparison is not vacuous

    w1, w2 = load_checkpoint(one).model.state_dict(), load_checkpoint(two).model.state_dict()
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=TOL, rtol=0, msg=k)
    assert len([p for p in two.iterdir() if p.name.startswith("ckpt_")]) == 1  # rank 0 alone wrote checkpoints

    # the tolerance tells right from wrong: one process with half the global batch is far outside it
    half = tmp_path / "half"
    _run([sys.executable, "-m", "gptbook", *COMMON, "--batch-size", "4", "--out", str(half)])
    assert max(abs(a["val_loss"] - b["val_loss"]) for a, b in zip(read_metrics(half)[1:], m2[1:])) > 100 * TOL
