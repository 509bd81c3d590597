"""Chapter 17's measurements: the fine-tuned models of chapter 16 improved by RL (`gptbook.book.baby.rl_run`), scored
by exact match on held-out test items before and after, with 95% bootstrap intervals of the paired change; the
answers' length and how often they end with <|end|> (reward hacking would show there); RL's wall time and KL.

    python bench/reward.py [--threads 2] [--n-test 900]

The RL runs are the book's cached runs (trained once, reused by the chapter); their training time is the steps' wall
time from metrics.jsonl (evaluations left out). Writes bench/results/reward.json, which chapter 17 prints.
"""

import argparse
import json
from pathlib import Path

import torch

from gptbook.book.baby import baby_run, rl_run, sft_run
from gptbook.chat import bootstrap, chat_ids, complete, render, task_items
from gptbook.checkpoint import load_checkpoint
from gptbook.corpus import tiny_shakespeare
from gptbook.model import text_nats
from gptbook.reward import bits_per_byte
from gptbook.runs import read_metrics

TASKS = ("last_word", "add")  # reverse is solved by fine-tuning (100%): nothing for RL to raise
MAX_NEW = 32  # an answer that has not ended by then never ends


def train_seconds(run: Path) -> float:
    "The training steps' wall time of a run, from its metrics (the time between evaluations, evaluations left out)."
    h = read_metrics(run / "metrics.jsonl")
    return sum((r["iter"] - q["iter"]) * r["ms_per_iter"] / 1000 for q, r in zip(h, h[1:]))


def greedy(run: Path, items) -> dict:
    "Exact match of the greedy answers to `items`, their length in tokens and whether each ended."
    ck = load_checkpoint(run)
    prompts = [render([{"role": "user", "content": q}], ck.tokenizer, True)[0] for q, _ in items]
    answers = complete(ck.model, prompts, MAX_NEW, chat_ids(ck.tokenizer)[2])  # <|end|> left out
    ended = [len(a) < MAX_NEW for a in answers]
    right = [e and ck.tokenizer.decode(a) == want for a, e, (_, want) in zip(answers, ended, items)]
    return {"right": right, "tokens": sum(map(len, answers)) / len(answers), "ended": sum(ended) / len(ended)}


def measure(task: str, n_test: int) -> dict:
    items = task_items(task, "test", n_test)
    before, after = greedy(sft_run(task), items), greedy(rl_run(task), items)
    h = read_metrics(rl_run(task) / "metrics.jsonl")
    out = {"sft": bootstrap(before["right"]), "rl": bootstrap(after["right"])}
    out["rl_minus_sft"] = bootstrap(after["right"], before["right"])
    out |= {f"{k}_{name}": r[k] for name, r in (("sft", before), ("rl", after)) for k in ("tokens", "ended")}
    out |= {"rl_seconds": train_seconds(rl_run(task)), "steps": h[-1]["iter"], "kl_end": h[-1]["kl"]}
    out |= {"reward_start": h[1]["reward"], "reward_end": h[-1]["reward"]}
    print(task, json.dumps(out), flush=True)
    return out


def bits(run: Path, text: str) -> float:
    "Bits per byte of the model of `run` on `text`."
    ck = load_checkpoint(run)
    return bits_per_byte(text_nats(ck.model, torch.tensor(ck.tokenizer.encode(text))), text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-test", type=int, default=900)  # last_word has 912 distinct test lines
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tasks = {task: measure(task, args.n_test) for task in TASKS}
    machine = read_metrics(rl_run(TASKS[0]) / "metrics.jsonl")[-1]["machine"]
    results = {"machine": machine, "n_test": args.n_test, "tasks": tasks}
    text = tiny_shakespeare()
    text = text[len(text) * 9 // 10 :]  # the last tenth: the babies' validation text
    runs = {
        "char baby": baby_run("char"),
        "BPE baby": baby_run("bpe"),
        "BPE, fine-tuned on last_word": sft_run("last_word"),
    }
    runs["BPE, fine-tuned, then RL"] = rl_run("last_word")
    results["bits_per_byte"] = {name: bits(run, text) for name, run in runs.items()}
    results["bits_per_byte_bytes"] = len(text.encode())
    print(json.dumps(results["bits_per_byte"]), flush=True)
    path = Path(__file__).parent / "results" / "reward.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
