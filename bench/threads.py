"""Benchmark (not a test): `gptbook train`'s CPU threads, quiet and beside a competing job, against nanoGPT's train.py.

One run measures steps/s and tokens/s of the baby configuration (4 layers, 4 heads, d_model 128, context 64,
batch 12, Tiny Shakespeare characters, float32 on the CPU) for `gptbook train --threads 1`, `--threads 2` and the
default (no --threads), and for nanoGPT's train.py on the same model (biases included, as in gptbook's baby) with
its own thread count; each on a quiet machine and beside a load (a second `gptbook train --threads 1`, a job that
keeps one core busy). Each figure is the median of `--repeats` short runs; the repeats go round all the runs in
turn, so slow drifts in the machine's load touch every row alike. Evaluation is left out of both sides' timings.

usage:
    python bench/threads.py --nanogpt PATH            # a nanoGPT checkout or bare git dir (never copied here)
    python bench/threads.py --nanogpt PATH --steps 40 --repeats 1 --no-write   # a quick check of the script

nanoGPT's train.py, model.py and configurator.py and the data in its format are written to a temporary folder
and run there. Writes bench/results/threads.json.
"""

import argparse
import importlib.util
import json
import os
import pickle
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "threads.json"
TOKENS_PER_STEP = 12 * 64
NANOGPT_FILES = ["train.py", "model.py", "configurator.py"]


def _bench_train():
    "bench/train.py as a module (the name `train` is taken by the package)."
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NANOGPT_FLAGS = [  # nanoGPT README's CPU "baby GPT" (bench/train.py's list) with gptbook's baby settings
    *(flag for flag in _bench_train().NANOGPT_CPU_FLAGS if not flag.startswith("--eval_iters")),
    "--eval_iters=1",
    "--dataset=shakespeare_char",
    "--bias=True",  # the same model as gptbook's baby: GPT-2 style, with biases (nanoGPT's default: none)
    "--gradient_accumulation_steps=1",
    "--learning_rate=1e-3",
    "--beta2=0.99",
    "--dtype=float32",
    "--always_save_checkpoint=False",
]
ROWS = {"gptbook, 1 thread": "1", "gptbook, 2 threads": "2", "gptbook, default": None, "nanoGPT train.py": "nanogpt"}


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return env | {"PYTHONPATH": str(ROOT)}


def _busy() -> tuple[float, float, float]:
    "(CPU seconds busy on the machine, CPU seconds of finished children, wall time) now."
    with open("/proc/stat") as f:
        t = [int(x) for x in f.readline().split()[1:9]]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (sum(t) - t[3] - t[4]) / os.sysconf("SC_CLK_TCK"), children.ru_utime + children.ru_stime, time.time()


def _others(before, after) -> float:
    "CPUs kept busy by other processes than the measured one between two `_busy()` readings (Linux)."
    return ((after[0] - before[0]) - (after[1] - before[1])) / (after[2] - before[2])


def run_gptbook(threads: str | None, steps: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "gptbook", "train", "--out", str(out), "--overwrite", "--max-iters", str(steps)]
    cmd += ["--eval-interval", str(steps), "--eval-iters", "1", "--warmup-iters", str(steps // 2)]
    cmd += ["--device", "cpu", "--dtype", "float32", "--no-progress", "--sample-tokens", "0"]
    cmd += ["--threads", threads] if threads else []
    b0 = _busy()
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT)
    b1 = _busy()
    if r.returncode != 0:
        raise SystemExit(f"gptbook train failed:\n{r.stderr[-3000:]}")
    rec = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    used = int(re.search(r"^machine: .*?, (\d+) threads?,", r.stdout, re.M)[1])
    return {"steps_per_s": 1000 / rec["ms_per_iter"], "threads": used, "other_cpus": _others(b0, b1)}


def run_nanogpt(folder: Path, steps: int) -> dict:
    cmd = [sys.executable, "train.py", *NANOGPT_FLAGS, f"--max_iters={steps}", f"--lr_decay_iters={steps}"]
    cmd += [f"--warmup_iters={steps // 2}"]  # as gptbook's runs below
    cmd += [f"--eval_interval={steps}", "--out_dir=out"]
    b0 = _busy()
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=folder)
    b1 = _busy()
    if r.returncode != 0:
        raise SystemExit(f"nanoGPT train.py failed:\n{r.stderr[-3000:]}")
    ms = {int(m[1]): float(m[2]) for m in re.finditer(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", r.stdout, re.M)}
    steady = [t for i, t in ms.items() if i % steps != 0]  # iteration 0 (and `steps`) include an evaluation
    threads = int(re.search(r"threads (\d+)", r.stdout)[1]) if "threads " in r.stdout else None
    return {"steps_per_s": 1000 / statistics.mean(steady), "threads": threads, "other_cpus": _others(b0, b1)}


def prepare_nanogpt(src: Path, folder: Path) -> Path:
    "nanoGPT's files (from a checkout or a bare git dir) and Tiny Shakespeare in its shakespeare_char format."
    import numpy as np

    from gptbook.corpus import tiny_shakespeare

    for f in NANOGPT_FILES:
        if (src / f).is_file():
            text = (src / f).read_text()
        else:
            text = subprocess.run(["git", "--git-dir", str(src), "show", f"HEAD:{f}"], capture_output=True, text=True)
            text = text.stdout
        if f == "train.py":  # one line more in its log: the thread count it ran with
            text = text.replace(
                "\nif master_process:\n", "\nprint(f'threads {torch.get_num_threads()}')\nif master_process:\n", 1
            )
        (folder / f).write_text(text)
    text = tiny_shakespeare()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    d = folder / "data" / "shakespeare_char"
    d.mkdir(parents=True)
    n = int(len(text) * 0.9)
    np.array([stoi[c] for c in text[:n]], dtype=np.uint16).tofile(d / "train.bin")
    np.array([stoi[c] for c in text[n:]], dtype=np.uint16).tofile(d / "val.bin")
    with open(d / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return folder


def start_load(out: Path) -> subprocess.Popen:
    "A second `gptbook train --threads 1`, returned once it trains (its header printed)."
    cmd = [sys.executable, "-m", "gptbook", "train", "--out", str(out), "--overwrite", "--max-iters", "1000000"]
    cmd += ["--eval-interval", "1000000", "--threads", "1", "--no-progress", "--sample-tokens", "0"]
    load = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(), cwd=ROOT)
    for line in load.stdout:
        if line.startswith("step 0:"):  # past its first evaluation: training
            return load
    raise SystemExit("the load process stopped before training")


def measure(args, work: Path) -> dict:
    (work / "nanogpt").mkdir()
    nanogpt = prepare_nanogpt(args.nanogpt, work / "nanogpt") if args.nanogpt else None
    runs = {cond: {row: [] for row in ROWS if nanogpt or ROWS[row] != "nanogpt"} for cond in ("quiet", "loaded")}
    for cond in ("quiet", "loaded"):
        load = start_load(work / "load") if cond == "loaded" else None
        try:
            for rep in range(args.repeats):
                for row in runs[cond]:
                    what = ROWS[row]
                    r = (
                        run_nanogpt(nanogpt, args.steps)
                        if what == "nanogpt"
                        else run_gptbook(what, args.steps, work / "run")
                    )
                    print(
                        f"{cond:7} {rep} {row:20} {r['steps_per_s']:6.2f} steps/s, {r['threads']} threads, "
                        f"other CPUs busy {r['other_cpus']:.2f}",
                        flush=True,
                    )
                    runs[cond][row].append(r)
        finally:
            if load is not None:
                load.terminate()
                load.wait()
    return runs


def summarize(runs: dict) -> dict:
    rows = {}
    for row in runs["quiet"]:
        rows[row] = {}
        for cond in ("quiet", "loaded"):
            rs = runs[cond][row]
            sps = statistics.median(r["steps_per_s"] for r in rs)
            rows[row][cond] = {
                "steps_per_s": sps,
                "tokens_per_s": sps * TOKENS_PER_STEP,
                "threads": statistics.median_high([r["threads"] or 0 for r in rs]),
                "other_cpus": statistics.median(r["other_cpus"] for r in rs),
                "runs": rs,
            }
    return rows


def _cpu() -> str:
    names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
    return names[0] if names else platform.processor() or "an unnamed CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout or bare git dir (never copied into the repo)")
    ap.add_argument("--steps", type=int, default=100, help="training steps per run (default: 100)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure, the median kept (default: 3)")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write bench/results/threads.json")
    args = ap.parse_args()
    os.environ.setdefault("GPTBOOK_DATA", str(ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))
    sys.path.insert(0, str(ROOT))
    import torch

    t0 = time.time()
    with tempfile.TemporaryDirectory() as work:
        rows = summarize(measure(args, Path(work)))
    res = {
        "config": {"preset": "baby", "tokenizer": "char", "batch_size": 12, "context": 64, "dtype": "float32"},
        "nanogpt_flags": NANOGPT_FLAGS if args.nanogpt else None,
        "steps": args.steps,
        "repeats": args.repeats,
        "load": "a second `gptbook train --threads 1` (one core kept busy), started before the measured runs",
        "machine": {
            "cpu": _cpu(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
        },
        "rows": rows,
        "seconds": time.time() - t0,
        "note": "steps/s of the training steps only (evaluation left out on both sides); other_cpus: the CPUs that "
        "processes other than the measured one kept busy during its run (the load counts as about 1)",
    }
    print(f"\n{'':22}{'quiet tok/s':>13}{'loaded tok/s':>14}   ({res['seconds']:.0f} s)")
    for name, row in rows.items():
        print(f"{name:22}{row['quiet']['tokens_per_s']:>13,.0f}{row['loaded']['tokens_per_s']:>14,.0f}")
    if not args.no_write:
        RESULTS.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
