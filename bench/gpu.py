"""Benchmark (not a test): the figures the book's `#| cuda` cells claim, measured in one run on one CUDA GPU.

Sections, each one key of bench/results/gpu.json, in the order they run (about 8-10 minutes in all on an H100-class
GPU; the file is written after every section, so a run cut short keeps what it measured):
  attention     the chapter-3 manual attention (a materialized T x T score matrix) against the fused
                F.scaled_dot_product_attention, bfloat16, GPT-2 head shapes (batch 8, 12 heads, d_k 64),
                forward only, T = 1,024 ... 8,192: ms per call and peak extra memory (chapter 3's `#| cuda` cell)
  kernels       which kernel F.scaled_dot_product_attention picks with is_causal=True and with a boolean mask, and
                the largest difference between the flash and the math kernels (chapter 11's `#| cuda` cell)
  throughput    GPT-2 small training steps (forward, backward, fused AdamW), bfloat16 autocast, context 1,024,
                with and without torch.compile: ms/step, tokens/s and MFU against the GPU's dense bf16 peak
                (chapter 6's `#| cuda` cell)
  char_run      gptbook's trainer on nanoGPT's own GPU configuration for Tiny Shakespeare characters
                (config/train_shakespeare_char.py: 6 layers, 6 heads, 384 wide, context 256, batch 64, dropout 0.2,
                lr 1e-3 to 1e-4, warmup 100, beta2 0.99, 5,000 steps, bias-free, exact GELU; chapter 8's `#| cuda`
                cell): validation curve and wall time, against nanoGPT's published 1.4697
  nanogpt_char  nanoGPT's own train.py on that configuration, on the same GPU (needs --nanogpt)
  nanogpt       nanoGPT's train.py at the throughput section's configuration, on random tokens (needs --nanogpt)
  gpt2_char     GPT-2 small (12 x 768) on characters, context 256, batch 64, dropout 0.2, lr 6e-4, warmup 200,
                beta2 0.95, 5,000 steps: the brief's "GPT-2 small for ~5,000 steps reaches about 1.5"

nanoGPT's checkout (--nanogpt) is read, never copied into the repository: its files are extracted into bench/.work/.

usage:
    python bench/gpu.py                         # every section on cuda; writes bench/results/gpu.json
    python bench/gpu.py --nanogpt PATH          # with nanoGPT's train.py side by side
    python bench/gpu.py --only attention        # some sections (the others keep their stored results)
    python bench/gpu.py --dry-run --out X.json  # tiny sizes on the CPU: proves the script runs (what CI does)
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
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gptbook.attention import causal_mask, scaled_dot_product_attention
from gptbook.model import GPT, GPTConfig
from gptbook.train import TrainConfig, make_optimizer, train

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "gpu.json"
SECTIONS = ("attention", "kernels", "throughput", "char_run", "nanogpt_char", "nanogpt", "gpt2_char")
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}
FULL = {
    "attention": {"batch": 8, "heads": 12, "d_k": 64, "seq_lens": [1024, 2048, 4096, 8192], "reps": 10},
    "kernels": {"batch": 4, "heads": 12, "d_k": 64, "seq_len": 1024},
    "throughput": {"batch": 16, "seq_len": 1024, "steps": 30, "warmup": 10, "vocab_size": 50304},
    "char_run": {"max_iters": 5000, "eval_interval": 250, "eval_iters": 200, "batch_size": 64},
    "gpt2_char": {"max_iters": 5000, "eval_interval": 500, "eval_iters": 100, "batch_size": 64},
}
DRY = {  # the same code paths at sizes a CPU runs in seconds
    "attention": {"batch": 1, "heads": 2, "d_k": 16, "seq_lens": [64, 128], "reps": 2},
    "kernels": {"batch": 1, "heads": 2, "d_k": 16, "seq_len": 64},
    "throughput": {"batch": 2, "seq_len": 32, "steps": 3, "warmup": 1, "vocab_size": 96},
    "char_run": {"max_iters": 20, "eval_interval": 10, "eval_iters": 2, "batch_size": 4},
    "gpt2_char": {"max_iters": 20, "eval_interval": 10, "eval_iters": 2, "batch_size": 4},
}
DRY_MODEL = {"n_layers": 2, "n_heads": 2, "d_model": 32, "max_seq_len": 64}
# nanoGPT's config/train_shakespeare_char.py in gptbook's names (its train.py defaults: no biases, exact GELU)
SHAKESPEARE_CHAR = {"n_layers": 6, "n_heads": 6, "d_model": 384, "max_seq_len": 256, "dropout": 0.2}
NANOGPT_MODEL = {"bias": False, "ffn": "gelu"}
NANOGPT_PUBLISHED_VAL = 1.4697  # nanoGPT's README, this configuration on one A100


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(f, device: torch.device, reps: int) -> dict:
    "Mean ms per call of f() after one warm-up call, and (on CUDA) the peak memory it allocates beyond what was there."
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    f()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    sync(device)
    ms = (time.perf_counter() - t0) * 1000 / reps
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device.type == "cuda" else None
    return {"ms": ms, "peak_extra_mib": peak}


def peak_flops(device: torch.device, override_tflops: float | None) -> float | None:
    "The GPU's dense bfloat16 peak in FLOP/s (from its name, or --peak-tflops); None when unknown (no MFU then)."
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((t * 1e12 for key, t in PEAK_BF16_TFLOPS.items() if key in name), None)


def attention_row(T: int, device, dtype, sizes) -> dict:
    "Manual against fused attention at one T: the (T, T) matrices the manual path writes are what the fused one saves."
    shape = (sizes["batch"], sizes["heads"], T, sizes["d_k"])
    q = torch.randn(shape, device=device, dtype=dtype)
    k = torch.randn(shape, device=device, dtype=dtype)
    v = torch.randn(shape, device=device, dtype=dtype)
    mask = causal_mask(T, device=device)
    with torch.no_grad():
        manual = measure(lambda: scaled_dot_product_attention(q, k, v, mask), device, sizes["reps"])
        fused = measure(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device, sizes["reps"])
    shape = {
        "batch": sizes["batch"],
        "heads": sizes["heads"],
        "d_k": sizes["d_k"],
        "dtype": str(dtype).removeprefix("torch."),
    }
    return {"seq_len": T, **shape, "manual": manual, "fused": fused, "speedup": manual["ms"] / fused["ms"]}


def bench_attention(device, dtype, sizes) -> list[dict]:
    rows = []
    for T in sizes["seq_lens"]:
        rows.append(attention_row(T, device, dtype, sizes))
        print(f"attention T={T:>5}: manual {rows[-1]['manual']['ms']:8.2f} ms, fused {rows[-1]['fused']['ms']:8.2f} ms")
    return rows


def bench_kernels(device, dtype, sizes) -> dict:
    "The kernel SDPA picks with is_causal=True and with a boolean mask; the largest flash-vs-math difference."
    T = sizes["seq_len"]
    q = torch.randn(sizes["batch"], sizes["heads"], T, sizes["d_k"], device=device, dtype=dtype)
    mask = causal_mask(T, device=device)
    with torch.no_grad():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        with sdpa_kernel(SDPBackend.MATH):
            math_ = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    out = {
        "seq_len": T,
        "dtype": str(dtype).removeprefix("torch."),
        "is_causal": SDPBackend(torch._fused_sdp_choice(q, q, q, is_causal=True)).name,
        "bool_mask": SDPBackend(torch._fused_sdp_choice(q, q, q, attn_mask=mask)).name,
        "flash_vs_math_max_abs": (flash.float() - math_.float()).abs().max().item(),
    }
    print(f"kernels: is_causal -> {out['is_causal']}, boolean mask -> {out['bool_mask']}", flush=True)
    return out


def throughput_config(dry: bool, vocab_size: int, seq_len: int) -> GPTConfig:
    if dry:
        return GPTConfig(vocab_size=vocab_size, **{**DRY_MODEL, "max_seq_len": seq_len})
    return GPTConfig.gpt2_small(vocab_size=vocab_size, max_seq_len=seq_len)


def time_training(config, device, dtype, sizes, compile_model: bool, peak) -> dict:
    "ms per optimizer step (forward, backward, AdamW) on random tokens after `warmup` steps; tokens/s and MFU."
    torch.manual_seed(0)
    model = GPT(config).to(device)
    opt = make_optimizer(model, lr=6e-4, device_type=device.type)
    run = torch.compile(model) if compile_model else model
    x = torch.randint(0, config.vocab_size, (sizes["batch"], sizes["seq_len"] + 1), device=device)
    idx, targets = x[:, :-1], x[:, 1:]

    def step():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            _, loss = run(idx, targets=targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(sizes["warmup"]):  # compilation happens here, outside the timing
        step()
    r = measure(step, device, sizes["steps"])
    tokens_per_sec = idx.numel() * 1000 / r["ms"]
    mfu = model.mfu(tokens_per_sec, peak, seq_len=sizes["seq_len"]) if peak else None
    return {"ms_per_step": r["ms"], "tokens_per_sec": tokens_per_sec, "mfu": mfu, "peak_mib": r["peak_extra_mib"]}


def bench_throughput(device, dtype, sizes, peak, dry: bool) -> dict:
    config = throughput_config(dry, sizes["vocab_size"], sizes["seq_len"])
    out = {"params": GPT(config).num_params(), **sizes}
    for compile_model in (False, True):
        key = "compiled" if compile_model else "eager"
        if compile_model and dry:
            out[key] = None  # the CPU compile needs a C++ toolchain and minutes; the dry run checks the eager path
            continue
        out[key] = time_training(config, device, dtype, sizes, compile_model, peak)
        print(f"throughput {key}: {out[key]['tokens_per_sec']:,.0f} tokens/s", flush=True)
    return out


def _bench_train_module():
    "bench/train.py, which knows how to extract nanoGPT's files into bench/.work/ (loaded by path: `train` is taken)."
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_random_tokens(folder: Path, vocab_size: int, n: int = 2_000_000) -> None:
    "Random token ids in nanoGPT's format (uint16 train.bin, val.bin; no meta.pkl, so it uses its own vocab size)."
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        rng.integers(0, vocab_size, n, dtype=np.uint16).tofile(folder / f"{split}.bin")


def nanogpt_command(sizes, device, dry: bool, compile_model: bool) -> list[str]:
    shape = ["--n_layer=2", "--n_head=2", "--n_embd=32"] if dry else []  # nanoGPT's defaults are GPT-2 small
    return [
        sys.executable,
        "train.py",
        "--dataset=random",
        f"--device={device.type}",
        f"--dtype={'float32' if dry else 'bfloat16'}",
        f"--compile={compile_model}",
        f"--batch_size={sizes['batch']}",
        f"--block_size={sizes['seq_len']}",
        "--gradient_accumulation_steps=1",
        f"--max_iters={sizes['warmup'] + sizes['steps']}",
        "--eval_interval=100000",
        "--eval_iters=1",
        "--log_interval=1",
        "--dropout=0.0",
        "--bias=True",  # GPT-2's biases, as in our GPT-2 small (nanoGPT's default leaves them out)
        "--always_save_checkpoint=False",
        "--out_dir=out-gpu-bench",
        *shape,
    ]


def bench_nanogpt(src: Path, device, sizes, peak, dry: bool) -> dict:
    "nanoGPT's ms/iter after the same warm-up; MFU rescaled from its A100 figure (312 TFLOPS) to this GPU's peak."
    dst = _bench_train_module()._extract_nanogpt(src)
    write_random_tokens(dst / "data" / "random", sizes["vocab_size"], n=20_000 if dry else 2_000_000)
    out = {}
    for compile_model in (False, True):
        key = "compiled" if compile_model else "eager"
        if compile_model and dry:
            out[key] = None
            continue
        cmd = nanogpt_command(sizes, device, dry, compile_model)
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=dst)
        if r.returncode != 0:
            raise SystemExit(f"nanoGPT train.py failed:\n{r.stderr[-3000:]}")
        its = re.findall(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms, mfu (-?[\d.]+)%", r.stdout, re.M)
        steady = [(float(ms), float(mfu)) for i, ms, mfu in its if int(i) > sizes["warmup"]]
        ms = statistics.mean(t for t, _ in steady)
        a100_mfu = statistics.mean(m for _, m in steady[-5:]) / 100  # its running estimate, last iterations
        tokens_per_sec = sizes["batch"] * sizes["seq_len"] * 1000 / ms
        mfu = a100_mfu * 312e12 / peak if peak and a100_mfu > 0 else None
        out[key] = {"ms_per_step": ms, "tokens_per_sec": tokens_per_sec, "mfu": mfu}
        print(f"nanoGPT {key}: {tokens_per_sec:,.0f} tokens/s", flush=True)
    return out


def _train_run(cfg: TrainConfig) -> dict:
    "Train `cfg` with gptbook's trainer: its config, validation curve, best validation loss and wall time."
    t0 = time.perf_counter()
    run = train(cfg, overwrite=True)
    wall = time.perf_counter() - t0
    curve = [(r["iter"], round(r["val_loss"], 4)) for r in run.history]
    best = min(v for _, v in curve)
    print(f"{cfg.preset} run: best validation loss {best:.4f} in {wall:.0f} s", flush=True)
    return {"config": cfg.to_dict(), "val_curve": curve, "best_val_loss": best, "wall_s": wall}


def run_config(device, sizes, dry: bool, out_dir: Path, **recipe) -> TrainConfig:
    "A GPU run's TrainConfig: the `recipe` (model and optimizer fields) at the sizes of `sizes`."
    return TrainConfig(
        out_dir=str(out_dir),
        batch_size=sizes["batch_size"],
        max_iters=sizes["max_iters"],
        eval_interval=sizes["eval_interval"],
        eval_iters=sizes["eval_iters"],
        device=device.type,
        compile=not dry,
        progress=False,
        **recipe,
    )


def bench_char_run(device, sizes, dry: bool, out_dir: Path) -> dict:
    "Chapter 8's GPU run: gptbook's trainer on nanoGPT's Shakespeare configuration; the whole validation curve."
    model = {**(DRY_MODEL if dry else SHAKESPEARE_CHAR), **NANOGPT_MODEL}
    warmup = min(100, sizes["max_iters"] // 2)
    cfg = run_config(device, sizes, dry, out_dir, model_overrides=model, lr=1e-3, warmup_iters=warmup, beta2=0.99)
    res = _train_run(cfg)
    return {**res, "nanogpt_published_val_loss": NANOGPT_PUBLISHED_VAL}


def bench_nanogpt_char(src: Path, device, sizes, dry: bool) -> dict:
    "nanoGPT's train.py on its own Shakespeare configuration, on this GPU: its validation curve and wall time."
    bench_train = _bench_train_module()
    dst = bench_train._extract_nanogpt(src)
    bench_train._write_nanogpt_data(dst)
    shape = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=64", "--dtype=float32"] if dry else []
    cmd = [
        sys.executable,
        "train.py",
        "config/train_shakespeare_char.py",
        f"--device={device.type}",
        f"--compile={not dry}",
        f"--batch_size={sizes['batch_size']}",
        f"--max_iters={sizes['max_iters']}",
        f"--lr_decay_iters={sizes['max_iters']}",
        f"--eval_interval={sizes['eval_interval']}",
        f"--eval_iters={sizes['eval_iters']}",
        "--out_dir=out-gpu-char",
        *shape,
    ]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=dst)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"nanoGPT train.py failed:\n{r.stderr[-3000:]}")
    evals = re.findall(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)", r.stdout, re.M)
    curve = [(int(i), round(float(v), 4)) for i, _, v in evals]
    best = min(v for _, v in curve)
    print(f"nanoGPT shakespeare_char: best validation loss {best:.4f} in {wall:.0f} s", flush=True)
    return {"command": " ".join(cmd[1:]), "val_curve": curve, "best_val_loss": best, "wall_s": wall}


def bench_gpt2_char(device, sizes, dry: bool, out_dir: Path) -> dict:
    "GPT-2 small on characters for 5,000 steps: the brief's claim (validation loss about 1.5)."
    cfg = run_config(
        device,
        sizes,
        dry,
        out_dir,
        preset="baby" if dry else "gpt2-small",
        model_overrides=DRY_MODEL if dry else {"max_seq_len": 256, "dropout": 0.2},
        lr=6e-4,
        warmup_iters=min(200, sizes["max_iters"] // 2),
        beta2=0.95,
    )
    return _train_run(cfg)


def machine(device: torch.device) -> dict:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}


def run_sections(args, device, dtype, sizes, peak, save) -> dict:
    "Run the chosen sections in order, handing the results to `save` after each one."
    res = {}
    todo = {
        "attention": lambda: bench_attention(device, dtype, sizes["attention"]),
        "kernels": lambda: bench_kernels(device, dtype, sizes["kernels"]),
        "throughput": lambda: bench_throughput(device, dtype, sizes["throughput"], peak, args.dry_run),
        "char_run": lambda: bench_char_run(device, sizes["char_run"], args.dry_run, Path(tmp) / "char"),
        "nanogpt_char": lambda: bench_nanogpt_char(args.nanogpt, device, sizes["char_run"], args.dry_run),
        "nanogpt": lambda: bench_nanogpt(args.nanogpt, device, sizes["throughput"], peak, args.dry_run),
        "gpt2_char": lambda: bench_gpt2_char(device, sizes["gpt2_char"], args.dry_run, Path(tmp) / "gpt2"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in SECTIONS:
            if name in args.only and (args.nanogpt or not name.startswith("nanogpt")):
                try:
                    res[name] = todo[name]()
                except Exception:  # one section's failure costs only that section: the others still run
                    traceback.print_exc()
                    continue
                save(res)
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    ap.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout or bare git dir (never copied into the repo)")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU; writes only to --out")
    ap.add_argument("--out", type=Path, help=f"where to write the JSON (default {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, if its name is not in the table")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py needs a CUDA GPU; use --dry-run to check it on a CPU")
    if args.dry_run and args.out is None:
        raise SystemExit("--dry-run writes only where --out says (the stored GPU results are never overwritten)")
    os.environ.setdefault("GPTBOOK_DATA", str(ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    peak = peak_flops(device, args.peak_tflops)
    out = args.out or RESULTS
    stored = json.loads(out.read_text()) if out.is_file() and not args.dry_run else {}
    info = {**machine(device), "peak_bf16_flops": peak, "dry_run": args.dry_run}

    def save(res: dict) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**stored, **res, "machine": info}, indent=1) + "\n")

    run_sections(args, device, dtype, DRY if args.dry_run else FULL, peak, save)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
