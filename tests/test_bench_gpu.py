"The prepared GPU benchmark runs end to end at tiny sizes on the CPU (the GPU run itself needs a CUDA machine)."

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu.py"


def run(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=ROOT)


def test_dry_run_measures_every_section(tmp_path):
    out = tmp_path / "gpu.json"
    r = run("--dry-run", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert [row["seq_len"] for row in res["attention"]] == [64, 128]
    assert all(row["manual"]["ms"] > 0 and row["fused"]["ms"] > 0 for row in res["attention"])
    eager = res["throughput"]["eager"]
    assert (
        eager["tokens_per_sec"]
        == res["throughput"]["batch"] * res["throughput"]["seq_len"] * 1000 / eager["ms_per_step"]
    )
    curve = res["char_run"]["val_curve"]
    assert [it for it, _ in curve] == [0, 10, 20]
    assert curve[-1][1] < curve[0][1]  # it learns something even in 20 steps
    assert res["machine"]["dry_run"] is True


def test_dry_run_never_writes_the_stored_results():
    r = run("--dry-run")
    assert r.returncode != 0
    assert "--out" in r.stderr
