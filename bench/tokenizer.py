"""Tokenizer speed and memory: gptbook's pure-Python BPE beside HF tokenizers and tiktoken, on Tiny Shakespeare.

Every measurement is taken in this one run on this one machine, so the ratios compare like with like:

- training with the GPT-2 regex, vocab 10,000: ours vs HF tokenizers (target: at most HF's time);
- training without pre-tokenization, vocab 1,000: ours vs HF (target: at least 20x faster). HF is
  built for short words and takes minutes on one 1.1 MB "word", so it runs once, in a child process
  with a time cap (--hf-raw-cap); if it hits the cap the table reports a lower bound and says so;
- training without pre-tokenization, vocab 10,000: ours (target: under 30 s; HF is not run, it
  would take far longer than at vocab 1,000);
- encoding the whole text with the GPT-2-regex vocab-10,000 tokenizer: ours (cold: a fresh
  tokenizer, whose chunk cache holds only the tokens; warm: second call) vs tiktoken built from
  the same merges (`to_tiktoken()`), ids checked identical (target: cold, at least 0.5x
  tiktoken's throughput);
- peak memory (max RSS of a child process that only imports gptbook.tokenizer and trains; the
  interpreter's own ~20 MB included) for training on the full text (target: under 1 GiB).

    python bench/tokenizer.py                       # everything, ~10 minutes (HF's raw run dominates)
    python bench/tokenizer.py --hf-raw-cap 0        # skip HF's raw run, reuse the last measured value
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "tokenizer.json"


def shakespeare() -> str:
    "Tiny Shakespeare, straight from $GPTBOOK_DATA when set (gptbook.data's imports would inflate a child's memory)."
    p = Path(os.environ.get("GPTBOOK_DATA", ""))
    p = p / "tinyshakespeare.txt" if p.is_dir() else p
    if p.is_file():
        return p.read_text(encoding="utf-8")
    from gptbook.data import tiny_shakespeare  # imports torch: fine for the parent process

    return tiny_shakespeare()


def best_of(fn, repeats):
    "Fastest wall time of `repeats` calls, and the last result."
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def child(kind, vocab_size):
    "Run one training in this (fresh) process; print seconds and peak RSS as JSON."
    text = shakespeare()
    if kind.startswith("ours"):
        from gptbook.tokenizer import BPETokenizer, GPT2_PATTERN

        pattern = GPT2_PATTERN if kind == "ours-regex" else None
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t0 = time.perf_counter()
        tok = BPETokenizer.train(text, vocab_size, pattern=pattern)
        dt = time.perf_counter() - t0
        n = tok.vocab_size
    else:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        hf = Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=(kind == "hf-regex"))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t0 = time.perf_counter()
        hf.train_from_iterator([text], trainer)
        dt = time.perf_counter() - t0
        n = hf.get_vocab_size()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux -> MiB
    print(json.dumps({"seconds": dt, "peak_rss_mib": peak, "rss_before_mib": rss0, "vocab_size": n}))


def run_child(kind, vocab_size, cap=None):
    "Time one training in a child process; None if it ran past `cap` seconds."
    cmd = [sys.executable, __file__, "--child", kind, str(vocab_size)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=cap, check=True)
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{e.stderr}") from e
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", nargs=2, metavar=("KIND", "VOCAB"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--hf-raw-cap",
        type=float,
        default=600,
        help="time cap in seconds for HF's no-pre-tokenization vocab-1,000 training; 0 skips it and "
        "reuses the value in the last results file",
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs per timing; the fastest counts")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], int(a.child[1]))

    import tiktoken
    import tokenizers

    from gptbook.tokenizer import GPT2_PATTERN, BPETokenizer

    text = shakespeare()
    n_bytes = len(text.encode("utf-8"))
    rows = []

    def row(name, reference, ours, ratio, target, ok, note=""):
        rows.append(dict(name=name, reference=reference, ours=ours, ratio=ratio, target=target, ok=ok, note=note))
        verdict = "ok" if ok else "MISSED"
        print(
            f"{name}: reference {reference}, ours {ours}, ratio {ratio}, target {target}: {verdict} {note}", flush=True
        )

    # Training with the GPT-2 regex: fastest of `repeats` child runs each (fresh processes, no warm caches).
    hf_regex = min((run_child("hf-regex", 10_000) for _ in range(a.repeats)), key=lambda r: r["seconds"])
    ours_regex = min((run_child("ours-regex", 10_000) for _ in range(a.repeats)), key=lambda r: r["seconds"])
    r = ours_regex["seconds"] / hf_regex["seconds"]
    row(
        "train, GPT-2 regex, vocab 10,000",
        f"HF {hf_regex['seconds']:.2f} s",
        f"{ours_regex['seconds']:.2f} s",
        f"{r:.2f}x HF's time",
        "<= HF's time",
        r <= 1,
    )

    # Training without pre-tokenization (one run each: they are long).
    ours_raw_1k = run_child("ours-raw", 1_000)
    previous = json.loads(Path(a.out).read_text()) if Path(a.out).exists() else {}
    if a.hf_raw_cap > 0:
        hf_raw = run_child("hf-raw", 1_000, cap=a.hf_raw_cap)
        hf_raw_s, capped = (a.hf_raw_cap, True) if hf_raw is None else (hf_raw["seconds"], False)
        note = (
            f"HF stopped at the {a.hf_raw_cap:.0f} s cap: its time is a lower bound" if capped else "HF measured once"
        )
    else:
        old = previous.get("hf_raw_1000")
        if not old:
            raise SystemExit("--hf-raw-cap 0 needs an earlier results file with HF's raw time")
        hf_raw_s, capped = old["seconds"], old["capped"]
        note = f"HF's time from the run of {old['date']} (not rerun)"
    speedup = hf_raw_s / ours_raw_1k["seconds"]
    row(
        "train, no pre-tokenization, vocab 1,000",
        f"HF {'>' if capped else ''}{hf_raw_s:.0f} s",
        f"{ours_raw_1k['seconds']:.1f} s",
        f"{'>' if capped else ''}{speedup:.0f}x faster",
        ">= 20x faster",
        speedup >= 20,
        note,
    )
    hf_raw_record = (
        previous.get("hf_raw_1000")
        if a.hf_raw_cap <= 0
        else dict(seconds=hf_raw_s, capped=capped, cap=a.hf_raw_cap, date=time.strftime("%Y-%m-%d"))
    )

    ours_raw_10k = run_child("ours-raw", 10_000)
    row(
        "train, no pre-tokenization, vocab 10,000",
        "HF not run (slower than at vocab 1,000)",
        f"{ours_raw_10k['seconds']:.1f} s",
        "-",
        "< 30 s",
        ours_raw_10k["seconds"] < 30,
    )

    # Encoding the whole text: ours cold (fresh tokenizer each time) and warm, tiktoken from the same merges.
    tok = BPETokenizer.train(text, 10_000, pattern=GPT2_PATTERN)
    tt = tok.to_tiktoken()
    t_tt, ids_tt = best_of(lambda: tt.encode_ordinary(text), a.repeats + 2)

    def encode_cold():
        "Encode with a fresh tokenizer (no chunk seen yet); only the encoding is timed."
        fresh = BPETokenizer(tok.merges, tok.pattern)
        t0 = time.perf_counter()
        ids = fresh.encode(text)
        return time.perf_counter() - t0, ids

    cold, ids_ours = min((encode_cold() for _ in range(a.repeats + 2)), key=lambda r: r[0])
    warm_tok = BPETokenizer(tok.merges, tok.pattern)
    warm_tok.encode(text)
    warm, _ = best_of(lambda: warm_tok.encode(text), a.repeats)
    hf = tok.to_hf()
    t_hf, enc_hf = best_of(lambda: hf.encode(text), a.repeats)
    same = ids_ours == ids_tt == enc_hf.ids

    def mbs(seconds):
        return n_bytes / seconds / 1e6

    row(
        "encode 1.1 MB, GPT-2 regex, vocab 10,000",
        f"tiktoken {t_tt * 1e3:.0f} ms ({mbs(t_tt):.1f} MB/s)",
        f"cold {cold * 1e3:.0f} ms ({mbs(cold):.1f} MB/s), warm {warm * 1e3:.0f} ms",
        f"{t_tt / cold:.2f}x tiktoken's throughput (warm {t_tt / warm:.2f}x)",
        ">= 0.5x (cold), identical ids",
        t_tt / cold >= 0.5 and same,
        f"ids identical to tiktoken's and HF's: {same}; HF tokenizers encodes it in {t_hf * 1e3:.0f} ms",
    )

    peak = max(ours_raw_10k["peak_rss_mib"], ours_regex["peak_rss_mib"], ours_raw_1k["peak_rss_mib"])
    row(
        "peak memory, training on the full text",
        f"HF (regex, 10k) {hf_regex['peak_rss_mib']:.0f} MiB",
        f"{peak:.0f} MiB (no pre-tokenization, vocab 10,000: {ours_raw_10k['peak_rss_mib']:.0f} MiB; "
        f"GPT-2 regex: {ours_regex['peak_rss_mib']:.0f} MiB)",
        "-",
        "< 1024 MiB",
        peak < 1024,
        "max RSS of the training process, interpreter included",
    )

    # The table.
    head = ("measure", "reference", "ours", "ratio", "target", "")
    table = [head, ("---",) * 6] + [
        (r["name"], r["reference"], r["ours"], r["ratio"], r["target"], "ok" if r["ok"] else "MISSED") for r in rows
    ]
    lines = ["| " + " | ".join(cells) + " |" for cells in table]
    for r in rows:
        verdict = "ok" if r["ok"] else "MISSED"
        r["line"] = f"{r['name']}: {r['ours']} vs {r['reference']} -> {r['ratio']} (target {r['target']}: {verdict})"
    print("\n" + "\n".join(lines))
    for r in rows:
        if r["note"]:
            print(f"- {r['name']}: {r['note']}")
    result = dict(
        date=time.strftime("%Y-%m-%d %H:%M"),
        machine=dict(
            platform=platform.platform(),
            cpus=os.cpu_count(),
            python=platform.python_version(),
            load_average=os.getloadavg(),
        ),
        versions=dict(tokenizers=tokenizers.__version__, tiktoken=tiktoken.__version__),
        text_bytes=n_bytes,
        rows=rows,
        hf_raw_1000=hf_raw_record,
        table="\n".join(lines),
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
