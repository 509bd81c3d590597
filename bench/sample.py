"""Generation speed: KV cache vs no cache vs a minimal plain loop, tokens per second.

All three generate greedily from the same randomly initialised GPT (speed does not depend on the
weights), so they must produce the same tokens: the script checks that before reporting.

    python bench/sample.py                      # CPU, 512 new tokens, writes bench/results/sample.json
    python bench/sample.py --device cuda --out bench/results/sample_cuda.json
"""

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from gptbook.model import GPT, GPTConfig
from gptbook.sample import SamplingConfig, generate


@torch.no_grad()
def minimal_plain_loop(model, idx, max_new_tokens):
    "The textbook loop with nothing around it: crop, run the full context, argmax of the last logits, append."
    max_seq_len = model.config.max_seq_len
    for _ in range(max_new_tokens):
        last = model(idx[:, -max_seq_len:])[:, -1, :]  # (B, vocab_size)
        idx = torch.cat([idx, last.argmax(-1, keepdim=True)], dim=1)  # (B, T + 1)
    return idx


def timed(fn, device):
    "Run fn; return its output, wall-clock seconds and this process's CPU seconds."
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0, time.process_time() - c0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--n-layers", type=int, default=6)
    ap.add_argument("--n-heads", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--vocab-size", type=int, default=65)
    ap.add_argument("--positions", default="learned")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=1, help="runs per method; the fastest counts")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads (default 1: on a small shared machine, more threads spin against other jobs "
        "and the timings become noise; 0 = torch's default)",
    )
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sample.json"))
    a = ap.parse_args()
    if a.prompt_len + a.new_tokens > a.max_seq_len:
        ap.error("prompt_len + new_tokens must fit in max_seq_len (past it every loop is the plain loop)")

    device = torch.device(a.device)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=a.vocab_size,
        max_seq_len=a.max_seq_len,
        n_layers=a.n_layers,
        n_heads=a.n_heads,
        d_model=a.d_model,
        positions=a.positions,
    )
    model = GPT(cfg).to(device).eval()
    prompt = torch.randint(cfg.vocab_size, (1, a.prompt_len), device=device)
    generate(model, prompt, 8, temperature=0)  # warm-up (allocator, kernels)
    generate(model, prompt, 8, temperature=0, use_cache=False)

    greedy = SamplingConfig(max_new_tokens=a.new_tokens, temperature=0)
    methods = {
        "generate, KV cache": lambda: generate(model, prompt, config=greedy),
        "generate, no cache": lambda: generate(model, prompt, config=greedy.replace(use_cache=False)),
        "minimal plain loop (nanoGPT-style)": lambda: minimal_plain_loop(model, prompt, a.new_tokens),
    }
    # On a machine shared with other jobs the wall clock measures the other jobs too. With one
    # thread, CPU seconds are the compute this process did, whatever else runs: on CPU the speed
    # is reported from CPU time (tokens per CPU-second), and the wall clock is kept beside it.
    by_cpu = device.type == "cpu" and torch.get_num_threads() == 1
    print(f"{'method':36} {'wall s':>8} {'CPU s':>8} {'tokens/s':>9}  ({'per CPU-second' if by_cpu else 'wall clock'})")
    rows, outputs = [], {}
    for name, fn in methods.items():
        runs = [timed(fn, device) for _ in range(a.repeats)]
        out, wall, cpu = min(runs, key=lambda r: r[2] if by_cpu else r[1])
        sec = cpu if by_cpu else wall
        outputs[name] = out
        rows.append(
            {
                "method": name,
                "wall_seconds": round(wall, 3),
                "cpu_seconds": round(cpu, 3),
                "tokens_per_sec": round(a.new_tokens / sec, 1),
                "tokens_per_wall_sec": round(a.new_tokens / wall, 1),
            }
        )
        print(f"{name:36} {wall:8.2f} {cpu:8.2f} {a.new_tokens / sec:9.1f}", flush=True)
    ref = outputs["minimal plain loop (nanoGPT-style)"]
    same = {name: bool(torch.equal(out, ref)) for name, out in outputs.items()}
    assert all(same.values()), f"the loops disagree: {same}"
    speedup = rows[0]["tokens_per_sec"] / rows[1]["tokens_per_sec"]
    print(f"KV cache speed-up over no cache: {speedup:.1f}x (all three produced identical tokens)")

    result = {
        "benchmark": "greedy generation, batch 1",
        "new_tokens": a.new_tokens,
        "prompt_len": a.prompt_len,
        "model": {
            "n_layers": a.n_layers,
            "n_heads": a.n_heads,
            "d_model": a.d_model,
            "max_seq_len": a.max_seq_len,
            "vocab_size": a.vocab_size,
            "positions": a.positions,
            "params": sum(p.numel() for p in model.parameters()),
        },
        "device": str(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "tokens_per_sec_measured_by": "CPU time (one thread)" if by_cpu else "wall clock",
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "results": rows,
        "kv_cache_speedup": round(speedup, 1),
        "identical_tokens": True,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
