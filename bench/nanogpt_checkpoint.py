"""A real nanoGPT checkpoint, loaded into gptbook (chapter 11): equal logits and the same greedy text.

1. Trains nanoGPT's own train.py briefly on the CPU: the command its README gives for a CPU (the "baby" shape of
   config/train_shakespeare_char.py: 4 layers, 4 heads, 128 wide, context 64, batch 12, no dropout, no compile),
   cut to --iters iterations, so that it writes a real ckpt.pt (bias=False, as train.py defaults).
2. Loads that ckpt.pt with `gptbook.hf.from_nanogpt` (torch.load with weights_only=True) and compares its logits
   with nanoGPT's own model.py (imported from the extracted folder) on the same validation windows.
3. Continues a prompt greedily with gptbook's `generate(temperature=0)`, with nanoGPT's `GPT.generate(top_k=1)`
   and with nanoGPT's sample.py (`--top_k=1`: nanoGPT divides by the temperature, so 0 is not allowed).

usage:
    python bench/nanogpt_checkpoint.py                       # nanoGPT from /work/.mirror (a bare git dir)
    python bench/nanogpt_checkpoint.py --nanogpt PATH --iters 500 --threads 2

nanoGPT's files are extracted into bench/.work/nanogpt/ (git-ignored) by bench/train.py's helpers and never
committed. Writes bench/results/nanogpt_checkpoint.json.
"""

import argparse
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gptbook.hf import from_nanogpt
from gptbook.model import GPT, lm_loss

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "nanogpt_checkpoint.json"
DEFAULT_NANOGPT = Path(os.environ.get("NANOGPT_DIR", "/work/.mirror/karpathy+nanoGPT/repo"))  # a clone or bare git dir
OUT_DIR = "out-ckpt"  # inside bench/.work/nanogpt/
PROMPT = "ROMEO:"


def load_by_path(name: str, path: Path):
    "A module from a file (bench/train.py's name `train` is taken by the package; nanoGPT's `model` by nothing)."
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench_train():
    return load_by_path("bench_train", ROOT / "bench" / "train.py")


def prepare_nanogpt(src: Path) -> Path:
    "nanoGPT's files (plus sample.py) and Tiny Shakespeare in its format, in bench/.work/nanogpt/, via bench/train.py."
    bench_train = _bench_train()
    bench_train.NANOGPT_FILES = [*bench_train.NANOGPT_FILES, "sample.py"]
    dst = bench_train._extract_nanogpt(src)
    bench_train._write_nanogpt_data(dst)
    return dst


def nanogpt_commit(src: Path) -> str:
    git = ["git", "--git-dir", str(src)] if not (src / ".git").exists() else ["git", "-C", str(src)]
    return subprocess.run([*git, "log", "-1", "--format=%H %cs"], capture_output=True, text=True, check=True).stdout


def run(cmd: list[str], cwd: Path, threads) -> tuple[str, float]:
    "Run a nanoGPT script; its stdout and the wall time."
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    if r.returncode != 0:
        raise SystemExit(f"nanoGPT {cmd[1]} failed:\n{r.stderr[-3000:]}")
    return r.stdout, time.perf_counter() - t0


def train_nanogpt(dst: Path, iters: int, eval_interval: int, threads) -> dict:
    "nanoGPT's train.py on the CPU; what it printed at each evaluation and its steady time per iteration."
    flags = [
        *_bench_train().NANOGPT_CPU_FLAGS,
        f"--max_iters={iters}",
        f"--lr_decay_iters={iters}",
        f"--eval_interval={eval_interval}",
    ]
    cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", *flags, f"--out_dir={OUT_DIR}"]
    stdout, wall = run(cmd, dst, threads)
    evals = [
        {"iter": int(m[1]), "train_loss": float(m[2]), "val_loss": float(m[3])}
        for m in re.finditer(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)", stdout, re.M)
    ]
    times = [(int(m[1]), float(m[2])) for m in re.finditer(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", stdout, re.M)]
    steady = [ms for i, ms in times if i > 0 and i % eval_interval != 0]  # those after an eval include it
    return {
        "command": " ".join(["python", *cmd[1:]]),
        "evals": evals,
        "saved": stdout.count("saving checkpoint"),
        "ms_per_iter_median": round(statistics.median(steady), 1),
        "wall_s": round(wall, 1),
    }


def nanogpt_model(dst: Path, ckpt_path: Path):
    "nanoGPT's own GPT from its model.py, with the checkpoint's weights, as its sample.py loads them."
    model_py = load_by_path("nanogpt_model", dst / "model.py")
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    model = model_py.GPT(model_py.GPTConfig(**ckpt["model_args"]))
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    model.load_state_dict(state)
    return model.eval(), ckpt


def validation_windows(dst: Path, n: int, block: int) -> torch.Tensor:
    "n windows of `block` + 1 ids from nanoGPT's val.bin, evenly spaced: (n, block + 1), inputs and targets."
    val = np.fromfile(dst / "data" / "shakespeare_char" / "val.bin", dtype=np.uint16).astype(np.int64)
    starts = np.linspace(0, len(val) - block - 1, n).astype(int)
    return torch.from_numpy(np.stack([val[s : s + block + 1] for s in starts]))


def compare_logits(theirs, ours, windows: torch.Tensor) -> dict:
    "Logits of both models on every position (nanoGPT computes them all only when given targets), and both losses."
    ids, targets = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
    tanh = GPT(ours.config.replace(ffn="gelu_tanh")).eval()  # the same weights with GPT-2's GELU: a visible change
    tanh.load_state_dict(ours.state_dict())
    with torch.no_grad():
        their_logits, their_loss = theirs(ids, targets=targets)
        our_logits, tanh_logits = ours(ids), tanh(ids)
    return {
        "shape": list(ids.shape),
        "bitwise_equal": torch.equal(their_logits, our_logits),
        "max_abs_diff": float((their_logits - our_logits).abs().max()),
        "max_abs_diff_gelu_tanh": float((their_logits - tanh_logits).abs().max()),
        "max_abs_logit": float(their_logits.abs().max()),
        "one_position": {  # the first window's last position: all vocab_size logits, both models
            "nanogpt": [round(float(x), 6) for x in their_logits[0, -1]],
            "gptbook": [round(float(x), 6) for x in our_logits[0, -1]],
            "gptbook_gelu_tanh": [round(float(x), 6) for x in tanh_logits[0, -1]],
        },
        "nanogpt_loss_on_ids": round(float(their_loss), 6),
        "gptbook_loss_on_ids": round(float(lm_loss(our_logits, targets)), 6),
    }


def greedy_texts(dst: Path, theirs, ours, max_new: int, threads) -> dict:
    "The same prompt continued greedily by gptbook, by nanoGPT's GPT.generate and by nanoGPT's sample.py."
    from gptbook.data import tiny_shakespeare
    from gptbook.sample import generate
    from gptbook.tokenizer import CharTokenizer

    tok = CharTokenizer.train(tiny_shakespeare())  # the sorted characters: nanoGPT's meta.pkl vocabulary
    prompt = torch.tensor([tok.encode(PROMPT)])
    t0 = time.perf_counter()
    with torch.no_grad():
        ours_ids = generate(ours, prompt, max_new, temperature=0)
        ours_s = time.perf_counter() - t0
        theirs_ids = theirs.generate(prompt, max_new, top_k=1)
    flags = [f"--out_dir={OUT_DIR}", "--device=cpu", "--dtype=float32", "--num_samples=1", "--top_k=1"]
    cmd = [sys.executable, "sample.py", *flags, f"--start={PROMPT}", f"--max_new_tokens={max_new}"]
    stdout, _ = run(cmd, dst, threads)
    script_text = stdout.split("Loading meta from data/shakespeare_char/meta.pkl...\n", 1)[1].split("\n---", 1)[0]
    return {
        "prompt": PROMPT,
        "max_new_tokens": max_new,
        "gptbook": tok.decode(ours_ids[0].tolist()),
        "nanogpt_generate_top_k_1": tok.decode(theirs_ids[0].tolist()),
        "nanogpt_sample_py": script_text,
        "sample_py_command": " ".join(["python", *cmd[1:]]),
        "gptbook_generate_s": round(ours_s, 3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nanogpt", type=Path, default=DEFAULT_NANOGPT, help="a nanoGPT checkout or bare git dir")
    ap.add_argument("--iters", type=int, default=500, help="nanoGPT training iterations")
    ap.add_argument("--eval-interval", type=int, default=250, help="nanoGPT's eval_interval (its config's 250)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for nanoGPT's scripts")
    ap.add_argument("--max-new-tokens", type=int, default=200, help="greedy continuation length")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dst = prepare_nanogpt(args.nanogpt)
    training = train_nanogpt(dst, args.iters, args.eval_interval, args.threads)
    ckpt_path = dst / OUT_DIR / "ckpt.pt"
    t0 = time.perf_counter()
    ours = from_nanogpt(ckpt_path)
    load_s = time.perf_counter() - t0
    theirs, ckpt = nanogpt_model(dst, ckpt_path)
    ids = validation_windows(dst, n=8, block=ckpt["model_args"]["block_size"])
    res = {
        "nanogpt_commit": nanogpt_commit(args.nanogpt).split()[0],
        "nanogpt_commit_date": nanogpt_commit(args.nanogpt).split()[1],
        "training": training,
        "checkpoint": {
            "path": str(ckpt_path.relative_to(ROOT)),
            "iter_num": int(ckpt["iter_num"]),
            "best_val_loss": round(float(ckpt["best_val_loss"]), 4),
            "model_args": ckpt["model_args"],
            "keys": len(ckpt["model"]),
            "compiled_prefix": any(k.startswith("_orig_mod.") for k in ckpt["model"]),
        },
        "gptbook_config": ours.config.to_dict(),
        "gptbook_params": ours.num_params(),
        "from_nanogpt_s": round(load_s, 3),
        "logits": compare_logits(theirs, ours, ids),
        "greedy": greedy_texts(dst, theirs, ours, args.max_new_tokens, args.threads),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "cpus": os.cpu_count()},
    }
    RESULTS.write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    g = res["greedy"]
    same = g["gptbook"] == g["nanogpt_generate_top_k_1"] == g["nanogpt_sample_py"]
    print(f"val loss {training['evals'][-1]['val_loss']}, max |logit diff| {res['logits']['max_abs_diff']:.1e}")
    print(f"greedy texts equal: {same}; wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
