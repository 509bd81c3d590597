"""Benchmark (not a test): gptbook's trainer against nanoGPT's train.py on the CPU "baby" configuration.

Both train the same model on Tiny Shakespeare characters: 4 layers, 4 heads, d_model 128, context 64,
batch 12, lr 1e-3 (warmup 100, cosine to 1e-4), beta2 0.99, weight decay 0.1, clip 1.0, no dropout,
2,000 iterations, evaluation every 250 iterations on 20 batches, float32 on the CPU, no compile. We report
for each: the time per training iteration, tokens per second (12 x 64 = 768 tokens per iteration), the
validation loss at iteration 2,000 and the total wall time of the process.

usage:
    python bench/train.py                           # ours; nanoGPT's published reference figure
    python bench/train.py --nanogpt PATH            # also run nanoGPT from a checkout (or bare git dir)
    python bench/train.py --iters 200 --threads 1   # quicker / fixed thread count for both

nanoGPT's code is NEVER copied into this repository: its train.py, model.py, configurator.py and config
file are extracted into bench/.work/nanogpt/ (git-ignored) together with the data in its format
(train.bin/val.bin as uint16 plus meta.pkl), and run there. Writes bench/results/train.json.
"""

import argparse
import json
import os
import pickle
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / ".work"
RESULTS = ROOT / "bench" / "results" / "train.json"
TOKENS_PER_ITER = 12 * 64
NANOGPT_REFERENCE = {  # from issue 6: nanoGPT's train.py, this configuration, "this kind of machine", uncontended
    "val_loss_at_2000": 1.886,
    "ms_per_iter": 40.0,
    "tokens_per_sec": TOKENS_PER_ITER / 0.040,
    "source": "reference figure quoted in the project's issue 6 (not measured by this script)",
}
NANOGPT_FILES = ["train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py"]
# nanoGPT README's command for a CPU ("baby GPT"), without the iteration count (bench/nanogpt_checkpoint.py uses it too)
NANOGPT_CPU_FLAGS = [
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--log_interval=1",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--dropout=0.0",
]


def _env(threads):
    env = {**os.environ}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _load():
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def run_ours(iters: int, threads) -> dict:
    out = WORK / "ours"
    cmd = [
        sys.executable,
        "-m",
        "gptbook",
        "train",
        "--out",
        str(out),
        "--overwrite",  # the previous benchmark's run
        "--max-iters",
        str(iters),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--no-progress",
        "--sample-tokens",
        "0",
    ]
    load0, t0 = _load(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(threads), cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"gptbook train failed:\n{r.stderr[-3000:]}")
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [x for x in recs if x.get("ms_per_iter")]
    steps_between = [b["iter"] - a["iter"] for a, b in zip(recs, recs[1:])]
    total_ms = sum(x["ms_per_iter"] * n for x, n in zip(timed, steps_between))
    ms = total_ms / sum(steps_between)
    return {
        "ms_per_iter": ms,
        "tokens_per_sec": TOKENS_PER_ITER * 1000 / ms,
        "val_loss_at_end": recs[-1]["val_loss"],
        "train_loss_at_end": recs[-1]["train_loss"],
        "iters": recs[-1]["iter"],
        "wall_s": wall,
        "load_avg_before": load0,
        "val_curve": [(x["iter"], round(x["val_loss"], 4)) for x in recs],
    }


def _extract_nanogpt(src: Path) -> Path:
    "Copy nanoGPT's files from a checkout or a (bare) git dir into bench/.work/nanogpt; returns that folder."
    dst = WORK / "nanogpt"
    (dst / "config").mkdir(parents=True, exist_ok=True)
    for f in NANOGPT_FILES:
        if (src / f).is_file():
            shutil.copy(src / f, dst / f)
        else:
            text = subprocess.run(
                ["git", "--git-dir", str(src), "show", f"HEAD:{f}"], capture_output=True, text=True, check=True
            ).stdout
            (dst / f).write_text(text)
    return dst


def _write_nanogpt_data(dst: Path):
    "Tiny Shakespeare in nanoGPT's shakespeare_char format (what its prepare.py writes, minus the download)."
    import numpy as np
    from gptbook.data import tiny_shakespeare

    text = tiny_shakespeare()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    n = len(text)
    d = dst / "data" / "shakespeare_char"
    d.mkdir(parents=True, exist_ok=True)
    np.array([stoi[c] for c in text[: int(n * 0.9)]], dtype=np.uint16).tofile(d / "train.bin")
    np.array([stoi[c] for c in text[int(n * 0.9) :]], dtype=np.uint16).tofile(d / "val.bin")
    with open(d / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)


def run_nanogpt(src: Path, iters: int, threads) -> dict:
    dst = _extract_nanogpt(src)
    _write_nanogpt_data(dst)
    # the command of nanoGPT's README for a CPU ("baby GPT"), with our iteration count
    cmd = [
        sys.executable,
        "train.py",
        "config/train_shakespeare_char.py",
        *NANOGPT_CPU_FLAGS,
        f"--max_iters={iters}",
        f"--lr_decay_iters={iters}",
        "--out_dir=out-bench",
        "--always_save_checkpoint=False",
    ]
    load0, t0 = _load(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(threads), cwd=dst)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"nanoGPT train.py failed:\n{r.stderr[-3000:]}")
    its = {int(m[1]): float(m[2]) for m in re.finditer(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", r.stdout, re.M)}
    evals = [
        (int(m[1]), float(m[2]), float(m[3]))
        for m in re.finditer(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)", r.stdout, re.M)
    ]
    # nanoGPT times each iteration from the end of the previous one, so an iteration that follows an
    # evaluation includes it; leave those out, as our ms/iter leaves evaluation out
    steady = [t for i, t in its.items() if i > 0 and i % 250 != 0]
    ms = statistics.mean(steady)
    return {
        "ms_per_iter": ms,
        "ms_per_iter_median": statistics.median(steady),
        "tokens_per_sec": TOKENS_PER_ITER * 1000 / ms,
        "val_loss_at_end": evals[-1][2],
        "train_loss_at_end": evals[-1][1],
        "iters": evals[-1][0],
        "wall_s": wall,
        "load_avg_before": load0,
        "val_curve": [(i, v) for i, _, v in evals],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout or bare git dir (never copied into the repo)")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for both runs (default: PyTorch's choice)")
    ap.add_argument("--order", choices=["ours-first", "nanogpt-first"], default="ours-first")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write bench/results/train.json")
    args = ap.parse_args()
    os.environ.setdefault("GPTBOOK_DATA", str(ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))

    import torch

    res = {
        "config": {
            "n_layers": 4,
            "n_heads": 4,
            "d_model": 128,
            "context": 64,
            "batch_size": 12,
            "lr": 1e-3,
            "iters": args.iters,
            "eval_interval": 250,
            "eval_iters": 20,
            "dropout": 0.0,
            "dtype": "float32",
        },
        "machine": {
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": args.threads or torch.get_num_threads(),
            "platform": platform.platform(),
        },
    }
    runs = [("gptbook", lambda: run_ours(args.iters, args.threads))]
    if args.nanogpt:
        runs.append(("nanogpt", lambda: run_nanogpt(args.nanogpt, args.iters, args.threads)))
    if args.order == "nanogpt-first":
        runs.reverse()
    for name, fn in runs:
        print(f"running {name} ...", flush=True)
        res[name] = fn()
    if not args.nanogpt:
        res["nanogpt"] = {
            **NANOGPT_REFERENCE,
            "note": "nanoGPT was not run here: pass --nanogpt PATH to measure it "
            "side by side; the figures are the issue's reference",
        }
    res["note"] = (
        "ms/iter and tokens/s count training iterations only (evaluation excluded, on both sides); "
        "wall_s is the whole process, start-up and evaluations included. Other jobs on the machine "
        "(see load_avg_before) slow both runs."
    )
    print(f"\n{'':10}{'ms/iter':>10}{'tokens/s':>11}{'val loss':>10}{'at iter':>9}{'wall s':>9}")
    for name in ("gptbook", "nanogpt"):
        r = res[name]
        print(
            f"{name:10}{r['ms_per_iter']:>10.1f}{r['tokens_per_sec']:>11,.0f}"
            f"{r.get('val_loss_at_end', r.get('val_loss_at_2000')):>10.3f}{r.get('iters', 2000):>9}"
            f"{r.get('wall_s', float('nan')):>9.1f}"
        )
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(res, indent=1) + "\n")
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
