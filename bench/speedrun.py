"""Benchmark (not a test): the CPU speedrun of chapter 15 against nanoGPT's own train.py, on the same machine.

The target: validation loss at most 1.88 nats/char (nanoGPT's published CPU baby figure) on the whole validation
split of Tiny Shakespeare (`gptbook eval`), in at most half the training time of nanoGPT's train.py baby run
(2,000 iterations, the command of bench/train.py), both at 2 threads, evaluation left out of both clocks.

Each row of the record table (ROWS) is `gptbook train` with its flags, run for --seeds seeds one after the other
at 2 threads; then `gptbook eval` scores it on the validation text. nanoGPT runs --nanogpt-runs times, between the
rows. The changes that were tried on top of the third row (TRIED) run at 1 thread, two side by side, 2 seeds each:
their losses compare; their times only roughly. Four of them change the model in ways the package does not
offer (ReLU^2, QK-norm, zero-initialized projections, soft-capped logits): PATCHES applies them, in the run's
own process, to gptbook's classes (`python bench/speedrun.py --patch NAME train ...`), for training and eval.

usage:
    python bench/speedrun.py --nanogpt PATH          # a nanoGPT checkout or bare git dir (never copied here)
    python bench/speedrun.py --nanogpt PATH --only tried --merge   # redo the tried changes, keep the rows
    python bench/speedrun.py --nanogpt PATH --quick  # a check of the script: 30 steps, 2 seeds, nothing written

Writes bench/results/speedrun.json.
"""

import argparse
import runpy
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "speedrun.json"
run_nanogpt = runpy.run_path(str(ROOT / "bench" / "train.py"))["run_nanogpt"]  # bench/train.py's command and parsing
TARGET = 1.88
ROWS = [  # (name, what changed from the row above, the flags of `gptbook train`)
    ("baby (AdamW), 2,000 steps", "the book's baby: nanoGPT's model and recipe", []),
    (
        "+ Muon, 700 steps",
        "Muon (lr 0.02) for the blocks' matrices, AdamW (lr 1e-3) for the rest; warmup 20, no weight decay",
        ["--optimizer", "muon", "--weight-decay", "0", "--warmup-iters", "20", "--max-iters", "700"],
    ),
    (
        "+ AdamW at 1e-2, 650 steps",
        "AdamW's rate 10x (embeddings, gains, biases)",
        ["--preset", "speedrun", "--positions", "learned", "--max-iters", "650"],
    ),
    (
        "+ RoPE, 450 steps",
        "rotary positions for the learned table (the best of TRIED): the preset",
        ["--preset", "speedrun"],
    ),
]
TRIED = {  # on top of the third row (the preset with learned positions, 650 steps)
    "untied head (--no-tie-weights)": ["--no-tie-weights"],
    "no biases (--no-bias)": ["--no-bias"],
    "RMSNorm (--norm rmsnorm)": ["--norm", "rmsnorm"],
    "RoPE (--positions rope)": ["--positions", "rope"],
    "SwiGLU (--ffn swiglu)": ["--ffn", "swiglu"],
    "Muon's rate 0.03 (--muon-lr 0.03)": ["--muon-lr", "0.03"],
    "batch 24, 350 steps": ["--batch-size", "24", "--max-iters", "350"],
    "cosine to 0 (--min-lr-ratio 0)": ["--min-lr-ratio", "0"],
    "model shape: 2 layers, d_model 192": ["--n-layers", "2", "--d-model", "192"],
    "model shape: 6 layers, d_model 96": ["--n-layers", "6", "--d-model", "96"],
    "ReLU^2 for GELU (patch)": ["patch:relu2"],
    "QK-norm (patch)": ["patch:qknorm"],
    "zero-initialized output projections (patch)": ["patch:zero_init"],
    "logits soft-capped at 15 (patch)": ["patch:softcap"],
}


def _patch(name: str) -> None:
    "Change gptbook's model in this process: a change tried here that the package does not have."
    import types

    import torch
    import torch.nn.functional as F

    from gptbook import attention, layers, model

    if name == "relu2":  # modded-nanogpt's MLP: relu(x)^2 in place of GELU
        layers.FeedForward.forward = lambda self, x: self.dropout(self.c_proj(F.relu(self.c_fc(x)).square()))
    elif name == "qknorm":  # queries and keys RMS-normalized per head before the dot product
        sdpa = F.scaled_dot_product_attention
        norm = lambda t: F.rms_norm(t, (t.size(-1),))  # noqa: E731
        attention.F = types.SimpleNamespace(
            **{**vars(F), "scaled_dot_product_attention": lambda q, k, v, **kw: sdpa(norm(q), norm(k), v, **kw)}
        )
    elif name == "zero_init":  # every block's output projections start at zero: each block starts as the identity
        reset = model.GPT.reset_parameters

        def zero_reset(self):
            reset(self)
            for n, p in self.named_parameters():
                if n.endswith("c_proj.weight"):
                    torch.nn.init.zeros_(p)

        model.GPT.reset_parameters = zero_reset
    elif name == "softcap":  # logits = 15 tanh(logits / 15)
        forward = model.GPT.forward
        model.GPT.forward = lambda self, idx, targets=None, cache=None: (
            15 * torch.tanh(forward(self, idx, None, cache) / 15)
        )
    else:
        raise SystemExit(f"unknown patch {name!r}")


def run_gptbook(flags: list[str], seed: int, threads: int, folder: Path, val_text: Path, steps=None) -> dict:
    "One `gptbook train` run and its `gptbook eval` on the validation text: times, loss and the speed line."
    out = folder / f"run{seed}_{threads}_{abs(hash(tuple(flags)))}"
    patches = [f.removeprefix("patch:") for f in flags if f.startswith("patch:")]
    flags = [f for f in flags if not f.startswith("patch:")]
    gptbook = [sys.executable, "-m", "gptbook"] if not patches else [sys.executable, __file__, "--patch", *patches]
    cmd = [*gptbook, "train", *flags, "--out", str(out), "--seed", str(seed)]
    cmd += ["--threads", str(threads), "--device", "cpu", "--no-progress", "--sample-tokens", "0"]
    cmd += ["--max-iters", str(steps), "--warmup-iters", "5", "--eval-interval", str(steps)] if steps else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"gptbook train failed:\n{r.stderr[-3000:]}")
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_s = sum(b["ms_per_iter"] / 1000 * (b["iter"] - a["iter"]) for a, b in zip(recs, recs[1:]))
    speed = re.search(r"^speed: ([\d.]+) GFLOP/s .*? of the ([\d.]+) GFLOP/s", r.stdout, re.M)
    e = subprocess.run(
        [*gptbook, "eval", str(out), "--data", str(val_text), "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if e.returncode != 0:
        raise SystemExit(f"gptbook eval failed:\n{e.stderr[-3000:]}")
    loss = float(re.search(r"^loss ([\d.]+) nats/token", e.stdout, re.M)[1])
    run = {"seed": seed, "threads": threads, "steps": recs[-1]["iter"], "train_s": round(train_s, 2)}
    run |= {"val_loss": loss, "model_flops": float(speed[1]) * 1e9, "ceiling_flops": float(speed[2]) * 1e9}
    print(f"  seed {seed}: {run['train_s']:.1f} s, val loss {loss:.4f}", flush=True)
    return run


def main():
    if sys.argv[1:2] == ["--patch"]:  # a run of a tried change: patch gptbook, then run its command line
        _patch(sys.argv[2])
        from gptbook.cli import main as gptbook_main

        raise SystemExit(gptbook_main(sys.argv[3:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout or bare git dir")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--nanogpt-runs", type=int, default=3)
    ap.add_argument("--only", choices=["rows", "tried"])
    ap.add_argument("--merge", action="store_true", help="keep what the results file has for the parts not run")
    ap.add_argument("--quick", action="store_true", help="30 steps a run, 2 seeds, 1 nanoGPT run; nothing written")
    args = ap.parse_args()
    os.environ.setdefault("GPTBOOK_DATA", str(ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))
    import torch

    from gptbook.corpus import tiny_shakespeare

    seeds, steps = (range(2), 30) if args.quick else (range(args.seeds), None)
    res = json.loads(RESULTS.read_text()) if args.merge and RESULTS.exists() else {}
    res |= {"target": TARGET, "machine": {"cpus": os.cpu_count(), "torch": torch.__version__}}
    res["machine"] |= {"python": platform.python_version(), "platform": platform.platform()}
    with tempfile.TemporaryDirectory() as tmp:
        folder, text = Path(tmp), tiny_shakespeare()
        val_text = folder / "val.txt"
        val_text.write_text(text[int(len(text) * 0.9) :])  # the split of gptbook's char runs (val_fraction 0.1)
        if args.only != "tried":
            res["rows"], res["nanogpt"] = [], {"runs": []}
            nanogpt_iters = 30 if args.quick else 2000
            for i, (name, change, flags) in enumerate(ROWS):
                if i < (1 if args.quick else args.nanogpt_runs):  # nanoGPT between the rows: drifts touch both
                    print("nanoGPT train.py ...", flush=True)
                    n = run_nanogpt(args.nanogpt, nanogpt_iters, 2)
                    n = {"train_s": n["ms_per_iter"] * nanogpt_iters / 1000, "val_loss_own_eval": n["val_loss_at_end"]}
                    res["nanogpt"]["runs"].append(n)
                print(f"{name} ...", flush=True)
                runs = [run_gptbook(flags, s, 2, folder, val_text, steps) for s in seeds]
                command = " ".join(["gptbook train", *flags, "--threads 2"])
                res["rows"].append({"name": name, "change": change, "command": command, "runs": runs})
        if args.only != "rows":
            res["tried"] = {"reference": {}, "changes": {}}
            jobs = {"reference": []} | {name: flags for name, flags in TRIED.items()}
            with ThreadPoolExecutor(2) as pool:
                for name, flags in jobs.items():
                    print(f"tried: {name} ...", flush=True)
                    args_ = [([*ROWS[2][2], *flags], s, 1, folder, val_text, steps) for s in range(2)]
                    runs = list(pool.map(lambda a: run_gptbook(*a), args_))
                    entry = {"flags": flags, "val_loss": [r["val_loss"] for r in runs]}
                    entry["train_s"] = [r["train_s"] for r in runs]
                    res["tried"]["reference" if name == "reference" else "changes"][name] = entry
                res["tried"]["reference"] = res["tried"]["reference"]["reference"]
    if args.quick:
        print(json.dumps(res, indent=1)[:3000])
        return
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
