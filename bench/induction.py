"""Benchmark (not a test): an induction head caught forming, the experiment of chapter 14 (nbs/14_inside.ipynb).

A 2-layer attention-only transformer (`gptbook.inspect.AttentionOnly`) is trained on random token sequences in
which one segment is repeated right after itself (`repeat_batch`); every 25 steps `train_induction` records
the loss on the repeated targets and on the fresh ones, and each head's previous-token and induction scores.
The 2-layer model is trained from 5 seeds, a 1-layer model from 3; the phase change of each run is the first
step at which the repeated-target loss falls below ln(vocab) / 2 (`phase_change_step`). Each trained 2-layer model
then goes through `circuit_test`: every head zeroed and mean-ablated (losses, induction scores), and every head's
output patched from a clean repeat into a corrupted one, or zeroed on one copy only (the chapter's causal test).

usage:
    python bench/induction.py              # 8 runs of 1,500 steps, 1 torch thread each, 2 at a time: 11 min on
                                           # a 2-core VM shared with other jobs (load average 5), ~2 min per run;
                                           # about 15 s per run on an idle core
    python bench/induction.py --dry-run    # tiny sizes, seconds; writes only into --out if given
    python bench/induction.py --seeds 0 1 2 --steps 2000 --jobs 1

Writes bench/results/induction.json (or --out DIR/induction.json).
"""

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DRY_RUN = dict(steps=30, eval_every=10, seq_len=16, periods=(4, 8), probe_period=6, batch_size=8)


def one_run(args: tuple) -> dict:
    "Train one model (in a worker process, one torch thread) and return its record."
    n_layers, seed, kwargs = args
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from gptbook.inspect import circuit_test, phase_change_step, train_induction

    torch.set_num_threads(1)
    model, history = train_induction(n_layers=n_layers, seed=seed, **kwargs)
    vocab = kwargs.get("vocab_size", 64)
    run = dict(n_layers=n_layers, seed=seed, phase_step=phase_change_step(history, vocab), history=history)
    if n_layers == 2:  # the circuit's causal test: what each head costs, carries, and where it is needed
        sizes = dict(periods=kwargs.get("periods", (8, 16)), period=kwargs.get("probe_period", 12))
        run["circuit"] = circuit_test(model, seed, **sizes)
    return run


def summary(runs: list) -> dict:
    "Phase-change steps of the 2-layer runs and how many 1-layer runs had one."
    steps = [r["phase_step"] for r in runs if r["n_layers"] == 2]
    found = [s for s in steps if s is not None]
    mean = sum(found) / len(found) if found else None
    sd = (sum((s - mean) ** 2 for s in found) / (len(found) - 1)) ** 0.5 if len(found) > 1 else None
    ones = [r["phase_step"] for r in runs if r["n_layers"] == 1]
    return dict(two_layer_steps=steps, mean=mean, sd=sd, one_layer_changed=sum(s is not None for s in ones))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds of the 2-layer runs")
    p.add_argument("--one-layer-seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the 1-layer runs")
    p.add_argument("--steps", type=int, default=1500, help="training steps per run")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (each uses one torch thread)")
    p.add_argument("--out", type=Path, default=None, help="folder for induction.json (default: bench/results)")
    p.add_argument("--dry-run", action="store_true", help="one seed each, tiny sizes, seconds; writes only into --out")
    a = p.parse_args(argv)
    kwargs = dict(DRY_RUN) if a.dry_run else dict(steps=a.steps)
    seeds, one_layer_seeds = ([0], [0]) if a.dry_run else (a.seeds, a.one_layer_seeds)
    jobs = [(2, s, kwargs) for s in seeds] + [(1, s, kwargs) for s in one_layer_seeds]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        runs = list(pool.map(one_run, jobs))
    import torch
    from experiments import cpu_model  # bench/experiments.py (bench/ is on sys.path when this file runs as a script)

    from gptbook.files import atomic_write

    result = dict(
        command="python bench/induction.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        setup=dict(kwargs, steps=kwargs["steps"], threads_per_run=1, jobs=a.jobs),
        machine=dict(cpu=cpu_model(), cores=os.cpu_count(), torch=torch.__version__, load_avg_before=load),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        total_wall_s=time.perf_counter() - t0,
        summary=summary(runs),
        runs=runs,
    )
    s = result["summary"]
    print(
        f"2-layer phase change steps {s['two_layer_steps']} (mean {s['mean']}, sd {s['sd']}); "
        f"1-layer runs with one: {s['one_layer_changed']}; {result['total_wall_s']:.0f} s"
    )
    out = a.out if a.out is not None else (None if a.dry_run else RESULTS)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        with atomic_write(out / "induction.json") as f:
            f.write(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out / 'induction.json'}")
    return result


if __name__ == "__main__":
    main()
