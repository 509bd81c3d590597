"The prepared GPU benchmark runs end to end at tiny sizes on the CPU (the GPU run itself needs a CUDA machine)."

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptbook.book.results import NOT_MEASURED, gpu_figures

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu.py"


def run(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def dry_results(tmp_path_factory) -> Path:
    "A bench/results folder holding the gpu.json of a dry run (tiny sizes on the CPU)."
    folder = tmp_path_factory.mktemp("results")
    r = run("--dry-run", "--out", str(folder / "gpu.json"))
    assert r.returncode == 0, r.stderr[-2000:]
    return folder


def test_dry_run_measures_every_section(dry_results):
    res = json.loads((dry_results / "gpu.json").read_text())
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
    kernels = res["kernels"]
    assert kernels["seq_len"] == 64 and kernels["is_causal"] in {"FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"}
    assert 0 <= kernels["flash_vs_math_max_abs"] < 1e-3  # float32 on the CPU: the two kernels agree closely


def test_dry_run_never_writes_the_stored_results():
    r = run("--dry-run")
    assert r.returncode != 0
    assert "--out" in r.stderr


def test_the_chapters_show_the_figures_of_gpu_json(dry_results):
    "gpu_figures, which the chapters' cells beside their `#| cuda` cells print, shows what the file holds."
    res = json.loads((dry_results / "gpu.json").read_text())
    attention = gpu_figures("attention", dry_results)
    assert attention.splitlines()[1] == "a --dry-run: tiny sizes on a CPU, not the book's figures"
    assert f"manual {res['attention'][1]['manual']['ms']:.2f} ms" in attention and "T =   128" in attention
    assert attention.splitlines()[2] == "batch 1, 2 heads, d_k 16, float32, forward only"
    assert f"SDPA picks {res['kernels']['is_causal']} with is_causal=True" in gpu_figures("kernels", dry_results)
    eager = res["throughput"]["eager"]
    throughput = gpu_figures("throughput", dry_results)
    assert f"gptbook, eager: {eager['ms_per_step']:.1f} ms/step, {eager['tokens_per_sec']:,.0f} tokens/s" in throughput
    assert "gptbook, compiled: not run" in throughput  # the dry run skips torch.compile
    char = gpu_figures("char_run", dry_results)
    assert f"best val loss {res['char_run']['best_val_loss']:.4f} at step 20" in char and " 10:" in char
    assert "nanoGPT's README, one A100: 1.4697" in char
    kernels = gpu_figures("kernels", dry_results)
    texts = (attention, kernels, throughput, char, NOT_MEASURED)
    assert all(len(line) <= 80 for text in texts for line in text.splitlines())  # the width of a page's output


def test_the_stored_gpu_results_are_what_the_chapters_print():
    "bench/results/gpu.json (measured on a GPU): every section the chapters print is there, each line fits a page."
    stored = ROOT / "bench" / "results"
    if not (stored / "gpu.json").is_file():
        pytest.skip("no GPU has run bench/gpu.py yet")
    for section in ("attention", "kernels", "throughput", "char_run", "gpt2_char"):
        text = gpu_figures(section, stored)
        assert text != NOT_MEASURED and "dry-run" not in text
        assert all(len(line) <= 80 for line in text.splitlines()), section


def test_without_gpu_json_the_figures_are_not_yet_measured(tmp_path):
    assert gpu_figures("char_run", tmp_path) == NOT_MEASURED
    assert "not yet measured" in NOT_MEASURED and "`python bench/gpu.py`" in NOT_MEASURED
    (tmp_path / "gpu.json").write_text(json.dumps({"attention": [], "machine": {}}))  # a run of --only attention
    assert gpu_figures("throughput", tmp_path) == NOT_MEASURED
    with pytest.raises(ValueError, match="section must be one of attention, .* got 'flash'"):
        gpu_figures("flash", tmp_path)
