"""Benchmark (not a test): the ablations and expected-results cards of chapter 13 (nbs/13_experiments.ipynb).

Ablations. Small GPTs on Tiny Shakespeare characters, identical except for one switch, each trained from
3 seeds: pre- vs post-norm; attention with and without the 1/sqrt(d_k) scale; learned, sinusoidal (as GPT
adds it, scaled to the embeddings' size, and with the embeddings times sqrt(d_model)), RoPE or no positions;
GELU vs SwiGLU (same parameter count); LayerNorm vs RMSNorm; tied vs untied output head.
Every run uses the real trainer (`gptbook.train.Trainer`: AdamW, warmup + cosine, clipping). Within one
seed every variant sees the same training batches, so a variant and the reference form a pair; the
figure of merit is the cross-entropy on the whole validation split (every character predicted once).

Expected-results cards. The two configurations the book trains, `gptbook train` (baby model, characters)
and `gptbook train --tokenizer bpe` (baby model, BPE with 512 ids), 2,000 steps each: validation loss,
bits per character (one scale for both tokenizers), wall time and tokens/s on this machine. The
character card reuses bench/results/train.json (bench/train.py) when that file holds a 2,000-step run.

usage:
    python bench/experiments.py                   # everything, 1 torch thread: ~15 min on an idle core of a
                                                  # 2-core Xeon VM, ~35 min when other jobs share it
    python bench/experiments.py --quick           # smoke test: 1 seed, a few steps, nothing written
    python bench/experiments.py --only ablations  # or --only cards
    python bench/experiments.py --seeds 0 1 2 3 --steps 600 --threads 2
    python bench/experiments.py --only ablations --variants rope --merge   # redo one variant, keep the rest

Writes bench/results/experiments.json and bench/results/expected_results.json (or into --out DIR).
"""

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from gptbook.data import load_token_data
from gptbook.model import GPT, GPTConfig
from gptbook.train import TrainConfig, Trainer, TrainingDiverged, train

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# --- the ablation set-up ---------------------------------------------------------------------------

# The baby model (4 layers, 4 heads, context 64) at half its width, so that 27 runs fit a CPU budget.
ABLATION_MODEL = dict(n_layers=4, n_heads=4, d_model=64, max_seq_len=64, dropout=0.0)
# A short run of the book's schedule: warmup then cosine to 10%; eval_* only draws the (cheap) val curve.
# (At 400 steps every variant still sits near the bigram loss, ~2.4 nats, where context hardly matters.)
ABLATION_TRAIN = dict(
    batch_size=12,
    max_iters=800,
    lr=3e-3,
    warmup_iters=80,
    min_lr_ratio=0.1,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.99,
    grad_clip=1.0,
    eval_interval=200,
    eval_iters=8,
)
SEEDS = (0, 1, 2)
CURVE_BIN = 10  # the training-loss curve keeps the mean of every 10 steps
# SwiGLU has three matrices: a width of 8/3 d_model gives it the parameters of GELU's two at 4 d_model.
# (Llama's rounding up to a multiple of 256 would give 256 here, 1.5 times as many.)
SWIGLU_D_FF = round(8 * ABLATION_MODEL["d_model"] / 3)

# variant name -> GPTConfig fields changed from the reference (GPT-2 style: pre-norm LayerNorm, learned
# positions, GELU, tied head), whether attention drops the 1/sqrt(d_k) scale (no GPTConfig switch for it),
# and a factor for the sinusoidal table (GPT adds it as it is: entries of size ~0.7 onto embeddings of 0.02;
# the 2017 remedy, embed_scale, multiplies the embeddings by sqrt(d_model) instead)
PE_MATCHED = 0.02 * math.sqrt(2)  # a sinusoidal row has mean square 1/2: this factor makes its rms 0.02
VARIANTS = {
    "reference": dict(model={}, unscaled=False),
    "post_norm": dict(model={"norm_position": "post"}, unscaled=False),
    "unscaled": dict(model={}, unscaled=True),
    "sinusoidal": dict(model={"positions": "sinusoidal"}, unscaled=False),
    "sinusoidal_small": dict(model={"positions": "sinusoidal"}, unscaled=False, pe_scale=PE_MATCHED),
    "sinusoidal_embed_scale": dict(model={"positions": "sinusoidal", "embed_scale": True}, unscaled=False),
    "rope": dict(model={"positions": "rope"}, unscaled=False),
    "no_positions": dict(model={"positions": "none"}, unscaled=False),
    "swiglu": dict(model={"ffn": "swiglu", "d_ff": SWIGLU_D_FF}, unscaled=False),
    "rmsnorm": dict(model={"norm": "rmsnorm"}, unscaled=False),
    "untied": dict(model={"tie_weights": False}, unscaled=False),
}

# (name, question, [(label, variant), ...]); the first row of each is the reference it is compared with
ABLATIONS = [
    ("norm_position", "Pre-norm or post-norm?", [("pre-norm", "reference"), ("post-norm", "post_norm")]),
    (
        "attention_scale",
        "Does dividing the scores by sqrt(d_k) matter?",
        [("softmax(q·k/√d_k)", "reference"), ("softmax(q·k), unscaled", "unscaled")],
    ),
    (
        "positions",
        "Which positions?",
        [
            ("learned", "reference"),
            ("sinusoidal", "sinusoidal"),
            ("sinusoidal × 0.028", "sinusoidal_small"),
            ("sinusoidal, embed_scale", "sinusoidal_embed_scale"),
            ("RoPE", "rope"),
            ("none", "no_positions"),
        ],
    ),
    ("ffn", "GELU or SwiGLU?", [("GELU (tanh), d_ff 256", "reference"), (f"SwiGLU, d_ff {SWIGLU_D_FF}", "swiglu")]),
    ("norm", "LayerNorm or RMSNorm?", [("LayerNorm", "reference"), ("RMSNorm", "rmsnorm")]),
    ("tie_weights", "Tie the output head to the embedding?", [("tied", "reference"), ("untied", "untied")]),
]


def unscale_attention(model: GPT) -> list:
    """Make every attention layer compute softmax(q k^T) v, without the 1/sqrt(d_k); returns the hook handles.

    The model has no switch for it, so a forward hook multiplies the query part of each block's fused
    q/k/v projection by sqrt(head_dim): softmax((sqrt(d_k) q) k^T / sqrt(d_k)) = softmax(q k^T), with the
    same parameters and the same fused kernel. (RoPE rotates q afterwards; a rotation commutes with a scale.)
    """
    handles = []
    for blk in model.blocks:
        attn = blk.attn
        q_width = attn.n_heads * attn.head_dim
        scale = torch.ones(attn.c_attn.out_features)
        scale[:q_width] = math.sqrt(attn.head_dim)  # [q | k | v]: only q is scaled

        def hook(module, inputs, output, scale=scale):
            return output * scale.to(output)  # (B, T, (n_heads + 2 n_kv_heads) head_dim)

        handles.append(attn.c_attn.register_forward_hook(hook))
    return handles


def build_model(variant: str, vocab_size: int, seed: int, model: dict | None = None) -> GPT:
    "The ablation model of `variant` (see VARIANTS), initialized from `seed`."
    spec = VARIANTS[variant]
    config = GPTConfig.from_preset("baby", vocab_size, **{**ABLATION_MODEL, **(model or {}), **spec["model"]})
    torch.manual_seed(seed)
    gpt = GPT(config)
    if spec["unscaled"]:
        unscale_attention(gpt)
    if spec.get("pe_scale"):
        gpt.wpe.pe.mul_(spec["pe_scale"])  # the fixed table, at the token embeddings' size
    return gpt


@torch.no_grad()
def full_val_loss(model: GPT, val, context_len: int, batch_size: int = 128) -> float:
    "Mean cross-entropy (nats/token) over the whole split `val`, cut into non-overlapping windows of context_len."
    was_training = model.training
    model.eval()
    ids = torch.as_tensor(val.astype("int64") if hasattr(val, "astype") else val)
    n = (len(ids) - 1) // context_len  # windows
    x = ids[: n * context_len].view(n, context_len)  # (n, T)
    y = ids[1 : n * context_len + 1].view(n, context_len)  # (n, T) next tokens
    total = 0.0
    for i in range(0, n, batch_size):
        logits = model(x[i : i + batch_size])  # (b, T, vocab_size)
        total += torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), y[i : i + batch_size].flatten(), reduction="sum"
        ).item()
    model.train(was_training)
    return total / (n * context_len)


def _timing(history: list) -> tuple:
    "(ms per training step, steps timed) from a Trainer history: evaluation time is left out."
    steps = [b["iter"] - a["iter"] for a, b in zip(history, history[1:])]
    timed = [(r["ms_per_iter"], n) for r, n in zip(history[1:], steps) if r.get("ms_per_iter")]
    n = sum(k for _, k in timed)
    return (sum(ms * k for ms, k in timed) / n if n else None), n


def run_one(variant: str, seed: int, data, train: dict | None = None, model: dict | None = None) -> dict:
    "Train one ablation run with the real Trainer; returns its record (val loss on the whole split, curves, timing)."
    net = build_model(variant, data.vocab_size, seed, model)
    out = Path(tempfile.mkdtemp(prefix=f"gptbook-exp-{variant}-"))
    cfg = TrainConfig(
        out_dir=str(out),
        **{**ABLATION_TRAIN, **(train or {})},
        seed=seed,
        device="cpu",
        dtype="float32",
        progress=False,
        keep_last=1,
    )
    trainer = Trainer(net, data, cfg, net.config)
    t0, diverged = time.perf_counter(), False
    try:
        trainer.fit()
    except TrainingDiverged:
        diverged = True
    finally:
        shutil.rmtree(out, ignore_errors=True)
    wall = time.perf_counter() - t0
    losses = trainer.step_losses
    curve_steps = [min(i + CURVE_BIN, len(losses)) for i in range(0, len(losses), CURVE_BIN)]
    curve = [statistics.fmean(losses[i : i + CURVE_BIN]) for i in range(0, len(losses), CURVE_BIN)]
    ms, _ = _timing(trainer.history)
    val = None if diverged else full_val_loss(net, data.val, net.config.max_seq_len)
    return {
        "variant": variant,
        "seed": seed,
        "val_loss": None if val is None else round(val, 5),
        "diverged": diverged,
        "steps": trainer.step,
        "num_params": net.num_params(),
        "curve": {"step": curve_steps, "train_loss": [round(v, 4) for v in curve]},
        "evals": [
            {"iter": r["iter"], "train_loss": round(r["train_loss"], 4), "val_loss": round(r["val_loss"], 4)}
            for r in trainer.history
        ],
        "ms_per_step": None if ms is None else round(ms, 2),
        "wall_s": round(wall, 2),
    }


def _mean_std(xs: list) -> tuple:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def compare(ref: list, var: list) -> dict:
    """Paired comparison of per-seed losses (same seeds, same order): the mean difference var - ref, its
    standard deviation over seeds, and a verdict. A difference counts as measured when every seed shows it
    with the same sign and its mean exceeds two standard errors; otherwise 'no measurable difference'."""
    if any(v is None for v in var):
        return {"diff_mean": None, "diff_std": None, "verdict": "diverged"}
    d = [v - r for r, v in zip(ref, var)]
    mean, std = _mean_std(d)
    se = std / math.sqrt(len(d))
    same_sign = all(x > 0 for x in d) or all(x < 0 for x in d)
    if len(d) < 2:
        verdict = "one seed: no verdict"
    elif same_sign and abs(mean) > 2 * se:
        verdict = "worse" if mean > 0 else "better"
    else:
        verdict = "no measurable difference"
    return {"diff_mean": round(mean, 4), "diff_std": round(std, 4), "verdict": verdict}


def summarize(runs: list) -> list:
    "The ablation table: per variant the losses over seeds, their mean and spread, and the paired comparison."
    by = {}
    for r in runs:
        by.setdefault(r["variant"], {})[r["seed"]] = r
    out = []
    for name, question, rows in ABLATIONS:
        if not all(v in by for _, v in rows):
            continue
        seeds = sorted(set.intersection(*(set(by[v]) for _, v in rows)))
        ref = [by[rows[0][1]][s]["val_loss"] for s in seeds]
        table = []
        for label, v in rows:
            losses = [by[v][s]["val_loss"] for s in seeds]
            ok = [x for x in losses if x is not None]
            mean, std = _mean_std(ok) if ok else (None, None)
            row = {
                "label": label,
                "variant": v,
                "seeds": seeds,
                "val_losses": losses,
                "mean": None if mean is None else round(mean, 4),
                "std": None if std is None else round(std, 4),
                "num_params": by[v][seeds[0]]["num_params"],
            }
            if v != rows[0][1]:
                row.update(compare(ref, losses))
            table.append(row)
        out.append(
            {
                "name": name,
                "question": question,
                "reference": rows[0][0],
                "rows": table,
                "conclusion": conclusion(table),
            }
        )
    return out


def conclusion(rows: list) -> str:
    "One plain sentence per compared variant, from the paired differences."
    ref, parts = rows[0]["label"], []
    for r in rows[1:]:
        if r["verdict"] == "diverged":
            parts.append(f"{r['label']} diverged")
        elif r["verdict"] in ("better", "worse"):
            parts.append(
                f"{r['label']} is {r['verdict']} than {ref} by {abs(r['diff_mean']):.3f} ± "
                f"{r['diff_std']:.3f} nats on every seed"
            )
        else:
            parts.append(
                f"{r['label']} vs {ref}: {r['verdict']} at this scale "
                f"({r['diff_mean']:+.3f} ± {r['diff_std']:.3f} nats)"
            )
    return "; ".join(parts) + "."


def ablation_table(ablation: dict) -> str:
    "A markdown table of one ablation (the chapter prints exactly this; tests/test_experiments.py checks it)."
    lines = [
        "| variant | val loss (nats/char), mean ± std | per seed | vs " + ablation["reference"] + " | parameters |",
        "|---|---|---|---|---|",
    ]
    for r in ablation["rows"]:
        loss = "diverged" if r["mean"] is None else f"{r['mean']:.3f} ± {r['std']:.3f}"
        seeds = ", ".join("diverged" if x is None else f"{x:.3f}" for x in r["val_losses"])
        if "verdict" not in r:
            vs = "reference"
        elif r["diff_mean"] is None:
            vs = "diverged"
        else:
            vs = f"{r['diff_mean']:+.3f} ± {r['diff_std']:.3f} ({r['verdict']})"
        lines.append(f"| {r['label']} | {loss} | {seeds} | {vs} | {r['num_params']:,} |")
    return "\n".join(lines)


def run_ablations(data, seeds=SEEDS, train: dict | None = None, variants=None, log=print) -> list:
    "Every variant (each run once, shared by the ablations that use it) from every seed: the list of run records."
    variants = variants or list(VARIANTS)
    runs = []
    for seed in seeds:
        for v in variants:
            r = run_one(v, seed, data, train)
            runs.append(r)
            val = "diverged" if r["diverged"] else f"{r['val_loss']:.4f}"
            log(f"  seed {seed} {v:13} val loss {val:>8}  {r['ms_per_step'] or 0:6.1f} ms/step  {r['wall_s']:6.1f} s")
    return runs


# --- expected-results cards ------------------------------------------------------------------------


def bits_per_char(loss: float, n_tokens: int, n_chars: int) -> float:
    "Nats per token to bits per character: loss * n_tokens / (n_chars * ln 2). Example: (ln 2, 1, 1) -> 1.0"
    return loss * n_tokens / (n_chars * math.log(2))


def cpu_model() -> str:
    "The CPU's model name from /proc/cpuinfo (or platform.processor() where that file does not exist)."
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(threads=None) -> dict:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": threads or torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": "cpu",
        "dtype": "float32",
    }


def _load():
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def val_chars_per_token(data) -> tuple:
    "(tokens, characters) of the validation split: the characters are those of the decoded ids."
    ids = [int(t) for t in data.val]
    return len(ids), len(data.tokenizer.decode(ids))


def run_card(name: str, tokenizer: str, bpe_vocab_size: int = 512, steps: int = 2000, eval_interval: int = 250) -> dict:
    "Train one configuration of the book exactly as `gptbook train` does (CPU, float32) and make its card."
    t0 = time.perf_counter()
    data = load_token_data(tokenizer, bpe_vocab_size)
    tokenize_s = time.perf_counter() - t0
    out = Path(tempfile.mkdtemp(prefix=f"gptbook-card-{name}-"))
    cfg = TrainConfig(
        out_dir=str(out),
        tokenizer=tokenizer,
        bpe_vocab_size=bpe_vocab_size,
        max_iters=steps,
        eval_interval=min(eval_interval, steps),
        device="cpu",
        dtype="float32",
        progress=False,
    )
    load0, t0 = _load(), time.perf_counter()
    try:
        trainer = train(cfg, data=data)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    wall = time.perf_counter() - t0
    ms, _ = _timing(trainer.history)
    n_tok, n_chars = val_chars_per_token(data)
    last = trainer.history[-1]
    whole = full_val_loss(trainer.model, data.val, trainer.context_len)
    return make_card(
        name,
        tokenizer,
        data.vocab_size,
        trainer.model.num_params(),
        cfg,
        trainer.context_len,
        last["val_loss"],
        last["train_loss"],
        n_tok,
        n_chars,
        wall,
        ms,
        load0,
        [(r["iter"], round(r["val_loss"], 4)) for r in trainer.history],
        source="measured by bench/experiments.py",
        val_loss_whole_split=whole,
        tokenize_s=tokenize_s,
    )


def make_card(
    name,
    tokenizer,
    vocab_size,
    num_params,
    cfg,
    context_len,
    val_loss,
    train_loss,
    n_tok,
    n_chars,
    wall_s,
    ms_per_step,
    load_avg,
    val_curve,
    source,
    val_loss_whole_split=None,
    tokenize_s=None,
) -> dict:
    tokens_per_step = cfg.batch_size * context_len * cfg.grad_accum
    tps = tokens_per_step * 1000 / ms_per_step
    return {
        "name": name,
        "command": "gptbook train" + (" --tokenizer bpe" if tokenizer == "bpe" else ""),
        "tokenizer": tokenizer,
        "vocab_size": vocab_size,
        "num_params": num_params,
        "steps": cfg.max_iters,
        "batch_size": cfg.batch_size,
        "context_len": context_len,
        "tokens_per_step": tokens_per_step,
        "val_tokens": n_tok,
        "val_chars": n_chars,
        "chars_per_token": round(n_chars / n_tok, 4),
        "val_loss": round(val_loss, 4),
        "train_loss": round(train_loss, 4),
        "bits_per_token": round(val_loss / math.log(2), 4),
        "bits_per_char": round(bits_per_char(val_loss, n_tok, n_chars), 4),
        "val_loss_whole_split": None if val_loss_whole_split is None else round(val_loss_whole_split, 4),
        "bits_per_char_whole_split": None
        if val_loss_whole_split is None
        else round(bits_per_char(val_loss_whole_split, n_tok, n_chars), 4),
        "wall_s": round(wall_s, 1),
        "ms_per_step": round(ms_per_step, 2),
        "tokens_per_sec": round(tps),
        "chars_per_sec": round(tps * n_chars / n_tok),
        "load_avg_before": load_avg,
        "tokenize_s": None if tokenize_s is None else round(tokenize_s, 1),
        "val_curve": val_curve,
        "source": source,
    }


def char_card_from_train_json(path: Path = RESULTS / "train.json", steps: int = 2000):
    "The character card from bench/train.py's measurement of `gptbook train`, if it holds a run of `steps` steps."
    if not path.is_file():
        return None
    res = json.loads(path.read_text())
    ours = res.get("gptbook") or {}
    if ours.get("iters") != steps or "val_loss_at_end" not in ours:
        return None
    data = load_token_data("char")
    n_tok, n_chars = val_chars_per_token(data)
    cfg = TrainConfig(max_iters=steps)
    num_params = GPT(GPTConfig.from_preset("baby", data.vocab_size)).num_params()
    card = make_card(
        "baby-char",
        "char",
        data.vocab_size,
        num_params,
        cfg,
        res["config"]["context"],
        ours["val_loss_at_end"],
        ours["train_loss_at_end"],
        n_tok,
        n_chars,
        ours["wall_s"],
        ours["ms_per_iter"],
        ours.get("load_avg_before"),
        ours.get("val_curve"),
        source="bench/results/train.json (bench/train.py)",
    )
    card["threads"] = res.get("machine", {}).get("threads")
    return card


def speed_probe(datasets: dict, steps: int = 20, rounds: int = 5) -> dict:
    """Best-of-`rounds` ms per training step of the baby model on each dataset, in interleaved bursts of `steps`.

    On a shared machine a whole run's speed depends on what else runs; the fastest burst is the closest to the
    machine's own speed, and interleaving the configurations exposes them to the same conditions."""
    trainers, best = {}, {}
    out = Path(tempfile.mkdtemp(prefix="gptbook-speed-"))
    try:
        for name, data in datasets.items():
            torch.manual_seed(0)
            model = GPT(GPTConfig.from_preset("baby", data.vocab_size))
            cfg = TrainConfig(out_dir=str(out), device="cpu", dtype="float32", progress=False)
            trainers[name] = Trainer(model, data, cfg, model.config)
            trainers[name].train_step()  # the first step allocates: leave it out
            best[name] = math.inf
        for _ in range(rounds):
            for name, tr in trainers.items():
                t0 = time.perf_counter()
                for _ in range(steps):
                    tr.train_step()
                best[name] = min(best[name], 1000 * (time.perf_counter() - t0) / steps)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return best


def add_speed(card: dict, ms_best: float) -> dict:
    "Add the best-burst speed to a card."
    tps = card["tokens_per_step"] * 1000 / ms_best
    return {
        **card,
        "ms_per_step_best": round(ms_best, 2),
        "tokens_per_sec_best": round(tps),
        "chars_per_sec_best": round(tps * card["chars_per_token"]),
    }


def cards_table(cards: list) -> str:
    "A markdown table of the cards, one column per card (the chapter prints exactly this; tests check it)."
    rows = [
        ("command", lambda c: f"`{c['command']}`"),
        ("vocabulary", lambda c: f"{c['vocab_size']:,}"),
        ("parameters", lambda c: f"{c['num_params']:,}"),
        ("steps", lambda c: f"{c['steps']:,}"),
        ("tokens per step", lambda c: f"{c['tokens_per_step']:,}"),
        ("val loss (nats/token)", lambda c: f"{c['val_loss']:.3f}"),
        ("train loss (nats/token)", lambda c: f"{c['train_loss']:.3f}"),
        ("characters per token (val)", lambda c: f"{c['chars_per_token']:.2f}"),
        ("**bits per character (val)**", lambda c: f"**{c['bits_per_char']:.3f}**"),
        ("wall time of the run", lambda c: f"{c['wall_s']:.0f} s"),
        ("tokens/s, whole run", lambda c: f"{c['tokens_per_sec']:,}"),
        ("tokens/s, best burst", lambda c: f"{c['tokens_per_sec_best']:,}"),
        ("characters/s, best burst", lambda c: f"{c['chars_per_sec_best']:,}"),
    ]
    lines = ["| | " + " | ".join(c["name"] for c in cards) + " |", "|---|" + "---|" * len(cards)]
    lines += [f"| {label} | " + " | ".join(fmt(c) for c in cards) + " |" for label, fmt in rows]
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: seed 0, 20 steps, cards of 20 steps; writes nothing unless --out is given",
    )
    ap.add_argument("--only", choices=["ablations", "cards"], help="run only one of the two parts")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--steps", type=int, default=ABLATION_TRAIN["max_iters"], help="training steps per ablation run")
    ap.add_argument("--card-steps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier timings on a shared machine)")
    ap.add_argument("--rerun-char-card", action="store_true", help="train the char card even if train.json has it")
    ap.add_argument("--out", type=Path, help="folder for the JSON files (default bench/results; --quick: none)")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), help="run only these ablation variants")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="with --variants: replace those variants' runs in the existing experiments.json and keep the others",
    )
    args = ap.parse_args(argv)
    os.environ.setdefault("GPTBOOK_DATA", str(ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))
    torch.set_num_threads(args.threads)
    train_over = {}
    if args.quick:
        args.seeds, args.steps, args.card_steps = args.seeds[:1], 20, 20
        train_over = {"warmup_iters": 5, "eval_interval": 10, "eval_iters": 2}
    if args.steps != ABLATION_TRAIN["max_iters"] and not args.quick:
        train_over = {"warmup_iters": max(1, args.steps // 10), "eval_interval": max(1, args.steps // 4)}
    out = args.out if args.out is not None else (None if args.quick else RESULTS)
    machine = machine_info(args.threads)
    command = "python bench/experiments.py " + " ".join(argv if argv is not None else sys.argv[1:])
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")

    if args.only in (None, "ablations"):
        data = load_token_data("char")
        variants = args.variants or list(VARIANTS)
        setup = {
            "model": ABLATION_MODEL,
            "train": {**ABLATION_TRAIN, **train_over, "max_iters": args.steps},
            "seeds": args.seeds,
            "data": "Tiny Shakespeare, characters (65 ids), first 90% train",
            "metric": "cross-entropy in nats per character on the whole validation split "
            "(last 10%, non-overlapping windows of 64)",
            "curve": f"training loss, mean of each {CURVE_BIN} steps",
            "verdict_rule": "measured when every seed's paired difference has the same sign and the "
            "mean exceeds two standard errors; else 'no measurable difference'",
        }
        old = None
        if args.merge:
            if out is None or not (out / "experiments.json").is_file():
                raise SystemExit("--merge needs an existing experiments.json in --out (default bench/results)")
            old = json.loads((out / "experiments.json").read_text())
            if old["setup"] != json.loads(json.dumps(setup)):
                raise SystemExit("--merge: the stored runs used another set-up (model, training or seeds); rerun all")
        print(f"ablations: {len(variants)} variants x seeds {args.seeds}, {args.steps} steps each", flush=True)
        load0, t0 = _load(), time.perf_counter()
        runs = run_ablations(
            data, args.seeds, {**train_over, "max_iters": args.steps}, variants, log=lambda s: print(s, flush=True)
        )
        wall = round(time.perf_counter() - t0, 1)
        machine_now = {**machine, "load_avg_before": load0, "load_avg_after": _load()}
        if old is not None:  # keep the other variants' runs, replace these
            runs = [r for r in old["runs"] if r["variant"] not in variants] + runs
            runs.sort(key=lambda r: (r["seed"], list(VARIANTS).index(r["variant"])))
        res = {"date": stamp, "command": command.strip(), "machine": machine_now, "total_wall_s": wall}
        if old is not None:
            res = {**old, "merged": old.get("merged", []) + [res]}
        res.update(
            {
                "setup": setup,
                "variants": {
                    k: {
                        "model_overrides": v["model"],
                        "unscaled_attention": v["unscaled"],
                        "pe_scale": v.get("pe_scale"),
                    }
                    for k, v in VARIANTS.items()
                },
                "runs": runs,
                "ablations": summarize(runs),
            }
        )
        for a in res["ablations"]:
            print(f"\n{a['question']}\n{ablation_table(a)}\n{a['conclusion']}")
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "experiments.json").write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
            print(f"wrote {out / 'experiments.json'}")

    if args.only in (None, "cards"):
        cards = []
        char = None if (args.quick or args.rerun_char_card) else char_card_from_train_json(steps=args.card_steps)
        if char is None:
            print(f"card baby-char: training {args.card_steps} steps ...", flush=True)
            char = run_card("baby-char", "char", steps=args.card_steps)
            char["threads"] = args.threads
        cards.append(char)
        print(f"card baby-bpe512: training {args.card_steps} steps ...", flush=True)
        bpe = run_card("baby-bpe512", "bpe", 512, steps=args.card_steps)
        bpe["threads"] = args.threads
        cards.append(bpe)
        print("speed probe: interleaved bursts of 20 steps, best of 5 ...", flush=True)
        ms = speed_probe(
            {"baby-char": load_token_data("char"), "baby-bpe512": load_token_data("bpe", 512)},
            steps=2 if args.quick else 20,
            rounds=1 if args.quick else 5,
        )
        cards = [add_speed(c, ms[c["name"]]) for c in cards]
        res = {
            "date": stamp,
            "command": command.strip(),
            "machine": {**machine, "load_avg_after": _load()},
            "definition": "bits/char = val_loss (nats/token) * val tokens / (val chars * ln 2), over the "
            "validation split (last 10% of the ids); val_loss is the trainer's last evaluation "
            "(20 batches of 12 x 64 tokens); *_whole_split use every window of the split. "
            "tokens_per_sec: the whole run's training steps; *_best: the fastest of 5 interleaved "
            "bursts of 20 steps (speed_probe), the closest to the machine's own speed",
            "cards": cards,
        }
        print("\n" + cards_table(cards))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "expected_results.json").write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
            print(f"wrote {out / 'expected_results.json'}")


if __name__ == "__main__":
    main()
