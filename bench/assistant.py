"""Chapter 16's measurements: the BPE baby fine-tuned on each task, fully and with LoRA, scored by exact match on
held-out test items against the most frequent answer and the base model prompted few-shot; then the model fine-tuned
on one task fine-tuned further on another (AFTER), fully and with LoRA. 95% bootstrap intervals.

    python bench/assistant.py [--threads 2] [--n-test 500]

The fine-tuned runs are the book's cached runs (`gptbook.book.baby.sft_run`, trained once, reused by the chapter);
their training time is the steps' wall time from metrics.jsonl (evaluations left out). Writes
bench/results/assistant.json, which chapter 16 prints.
"""

import argparse
import collections
import json
from pathlib import Path

import torch

from gptbook.book.baby import baby_run, sft_run
from gptbook.chat import TASKS, add_lora, bootstrap, exact_match, few_shot, task_items
from gptbook.checkpoint import load_checkpoint
from gptbook.runs import read_metrics

LORA_RANK = 2
# (the chat model fine-tuned further, the task it learns next)
AFTER = [("add", "reverse"), ("add", "last_word"), ("first_word", "last_word"), ("last_word", "first_word")]


def train_seconds(run: Path) -> float:
    "The training steps' wall time of a run, from its metrics (the time between evaluations, evaluations left out)."
    h = read_metrics(run / "metrics.jsonl")
    return sum((r["iter"] - q["iter"]) * r["ms_per_iter"] / 1000 for q, r in zip(h, h[1:]))


def measure(task: str, base, n_test: int) -> dict:
    train_items, test = task_items(task, "train", 5000), task_items(task, "test", n_test)
    common = collections.Counter(a for _, a in train_items).most_common(1)[0][0]
    scores = {"most_frequent": [a == common for _, a in test]}
    scores["few_shot"] = few_shot(base.model, base.tokenizer, test, train_items[:8])
    runs = {"full": sft_run(task), "lora": sft_run(task, LORA_RANK)}
    for name, run in runs.items():
        ck = load_checkpoint(run)
        scores[name] = exact_match(ck.model, ck.tokenizer, test)
    out = {name: bootstrap(s) for name, s in scores.items()}
    out["full_lead_most_frequent"] = bootstrap(scores["full"], scores["most_frequent"])
    out["full_lead_few_shot"] = bootstrap(scores["full"], scores["few_shot"])
    best = max(("most_frequent", "few_shot"), key=lambda k: sum(scores[k]))
    out["full_lead"] = bootstrap(scores["full"], scores[best])
    out["lora_minus_full"] = bootstrap(scores["lora"], scores["full"])
    out |= {f"{name}_seconds": train_seconds(run) for name, run in runs.items()}
    out["most_frequent_answer"] = common
    print(task, json.dumps(out), flush=True)
    return out


def measure_after(after: str, task: str, n_test: int) -> dict:
    "Full fine-tuning and LoRA of the model fine-tuned on `after`, on `task`."
    test = task_items(task, "test", n_test)
    runs = {"full": sft_run(task, after=after), "lora": sft_run(task, LORA_RANK, after=after)}
    checkpoints = {name: load_checkpoint(run) for name, run in runs.items()}
    scores = {name: exact_match(ck.model, ck.tokenizer, test) for name, ck in checkpoints.items()}
    out = {name: bootstrap(s) for name, s in scores.items()}
    out["lora_minus_full"] = bootstrap(scores["lora"], scores["full"])
    out |= {f"{name}_seconds": train_seconds(run) for name, run in runs.items()}
    print(f"{task} after {after}", json.dumps(out), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-test", type=int, default=500)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = load_checkpoint(baby_run("bpe"))
    tasks = {task: measure(task, base, args.n_test) for task in TASKS}
    model = load_checkpoint(sft_run(next(iter(TASKS)))).model
    parameters = sum(p.numel() for p in model.parameters())
    adapters = sum(p.numel() for n, p in add_lora(model, LORA_RANK).named_parameters() if "lora_" in n)
    trained = adapters + 3 * model.config.d_model  # and the chat tokens' rows of the (tied) embedding
    trained_on = read_metrics(sft_run("add") / "metrics.jsonl")[-1]["machine"]  # where the runs' seconds come from
    results = {"machine": trained_on, "n_test": args.n_test, "parameters": parameters, "lora_trained": trained}
    results["tasks"] = tasks
    results["after_tasks"] = {f"{task} after {after}": measure_after(after, task, args.n_test) for after, task in AFTER}
    path = Path(__file__).parent / "results" / "assistant.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
