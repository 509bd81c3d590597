"""Chapter 13: the committed experiment results are well-formed and consistent, the chapter shows exactly
them, and the pieces of bench/experiments.py (the unscaled-attention hook, bits per byte, one run)
compute what they claim."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gptbook.model import GPT, GPTConfig
from gptbook.positions import apply_rope

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
NOTEBOOK = ROOT / "nbs" / "13_experiments.ipynb"


def _load_bench():
    spec = importlib.util.spec_from_file_location("experiments", ROOT / "bench" / "experiments.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["experiments"] = mod  # so that --workers' processes can refer to its functions by name
    spec.loader.exec_module(mod)
    return mod


E = _load_bench()


@pytest.fixture(scope="module")
def results():
    return json.loads((RESULTS / "experiments.json").read_text())


@pytest.fixture(scope="module")
def expected():
    return json.loads((RESULTS / "expected_results.json").read_text())


def _notebook_outputs() -> str:
    "Every text and markdown output saved in the chapter, concatenated."
    nb = json.loads(NOTEBOOK.read_text())
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if "text" in out:
                parts.append("".join(out["text"]))
            for kind in ("text/markdown", "text/plain"):
                if kind in out.get("data", {}):
                    parts.append("".join(out["data"][kind]))
    return "\n".join(parts)


# --- the results files ------------------------------------------------------------------------------


def check_experiments(res: dict, seeds=None, steps=None):
    "Structure and internal consistency of an experiments.json."
    seeds = seeds or res["setup"]["seeds"]
    steps = steps or res["setup"]["train"]["max_iters"]
    assert set(res["variants"]) == set(E.VARIANTS)
    got = [(r["variant"], r["seed"]) for r in res["runs"]]
    assert len(got) == len(set(got)), "at most one run per variant and seed"
    assert set(got) >= {(v, s) for v in E.VARIANTS for s in seeds}, "every variant on every protocol seed"
    assert {v for v, s in got} == set(E.VARIANTS)
    for r in res["runs"]:
        assert r["diverged"] == (r["val_loss"] is None)
        if not r["diverged"]:
            # below the 65-way uniform loss ln 65 = 4.17, above what any char model reaches on this text
            assert 0.8 < r["val_loss"] < math.log(65), r
            assert r["steps"] == steps
        s = r["curve"]["step"]
        assert s == sorted(s) and len(s) == len(r["curve"]["train_loss"]) and s[-1] == r["steps"]
        assert r["evals"][0]["iter"] == 0 and r["evals"][-1]["iter"] == r["steps"]
        assert all(math.isfinite(x) for x in r["curve"]["train_loss"])
    # the same variant has the same parameter count on every seed
    for v in E.VARIANTS:
        assert len({r["num_params"] for r in res["runs"] if r["variant"] == v}) == 1


def test_experiments_json_well_formed(results):
    check_experiments(results)
    assert len(results["setup"]["seeds"]) >= 2, "the chapter reports a spread: at least two seeds"
    m = results["machine"]
    assert m["cpu"] and m["torch"] and m["threads"] >= 1


def test_summary_recomputed_from_runs(results):
    "The stored ablation tables are what summarize() makes of the stored runs, and means/stds check out in NumPy."
    assert E.summarize(results["runs"], results["setup"]["seeds"]) == results["ablations"]
    names = [a["name"] for a in results["ablations"]]
    assert names == [name for name, _, _ in E.ABLATIONS], "every ablation is in the results"
    for a in results["ablations"]:
        ref = np.array(a["rows"][0]["val_losses"])
        for row in a["rows"]:
            losses = np.array(row["val_losses"], dtype=float)
            assert row["mean"] == pytest.approx(losses.mean(), abs=1e-4)
            assert row["std"] == pytest.approx(losses.std(ddof=1), abs=1e-4)
            if row is not a["rows"][0]:
                d = losses - ref
                assert row["diff_mean"] == pytest.approx(d.mean(), abs=1e-4)
                assert row["diff_std"] == pytest.approx(d.std(ddof=1), abs=1e-4)
                measured = (np.all(d > 0) or np.all(d < 0)) and abs(d.mean()) > 2 * d.std(ddof=1) / math.sqrt(len(d))
                assert row["verdict"] == (
                    ("worse" if d.mean() > 0 else "better") if measured else "no measurable difference"
                )


def test_reference_run_shared_by_every_ablation(results):
    "Each ablation compares against the same reference runs (one training per seed, not one per ablation)."
    ref = {r["seed"]: r["val_loss"] for r in results["runs"] if r["variant"] == "reference"}
    for a in results["ablations"]:
        row = a["rows"][0]
        assert row["variant"] == "reference" and row["val_losses"] == [ref[s] for s in row["seeds"]]
        assert set(row["seeds"]) >= set(results["setup"]["seeds"]), "every ablation has the protocol's seeds"


def test_every_row_has_exactly_the_protocols_seeds(results):
    "The protocol fixed five seeds for every variant in advance: no row has more (runs on other seeds: in no table)."
    assert results["setup"]["seeds"] == list(E.SEEDS) == [0, 1, 2, 3, 4]
    for a in results["ablations"]:
        for row in a["rows"]:
            assert row["seeds"] == list(E.SEEDS), (a["name"], row["label"])
    assert [r["df"] + 1 for r in E.all_comparisons(results["ablations"])] == [5] * 17, "the Holm family: 17 rows"


def test_runs_record_their_cpu_and_the_reruns_reproduce(results):
    "Every run names its CPU; the reference runs made on another CPU were rerun here and came out the same."
    runs = {(r["variant"], r["seed"]): r for r in results["runs"]}
    assert all(r["cpu"] for r in runs.values())
    reproduced = {(x["variant"], x["seed"]): x for x in results["reproduced"]}
    mixed = {s for (v, s), r in runs.items() if s in E.SEEDS and r["cpu"] != runs["reference", s]["cpu"]}
    for s in mixed:  # a pair made on two CPUs: its reference was rerun on the variant's
        x = reproduced["reference", s]
        assert x["stored_val_loss"] == x["rerun_val_loss"] == runs["reference", s]["val_loss"]
        assert x["evals_max_diff"] == 0 and x["curve_max_diff"] <= 1.5e-4, "at most a rounding of the 4th decimal"
        assert x["stored_cpu"] == runs["reference", s]["cpu"] != x["rerun_cpu"]


def test_lr_sweep_section(results):
    "The learning-rate check: the pre-stated variants and seeds at each rate, set-up as the main runs' but the rate."
    sweep = results["lr_sweep"]
    assert sorted(float(k) for k in sweep) == sorted(E.SWEEP_LRS)
    for key, rec in sweep.items():
        assert rec["setup"]["train"] == {**results["setup"]["train"], "lr": float(key)}
        assert rec["setup"]["model"] == results["setup"]["model"]
        got = sorted((r["variant"], r["seed"]) for r in rec["runs"])
        assert got == sorted((v, s) for v in E.SWEEP_VARIANTS for s in E.SWEEP_SEEDS)
        assert all(r["diverged"] == (r["val_loss"] is None) for r in rec["runs"])
    rows = E.lr_sweep(results)
    assert [r["variant"] for r in rows] == list(E.SWEEP_VARIANTS) and rows[0]["lrs"] == sorted([3e-3, *E.SWEEP_LRS])


def test_longer_runs_section(results):
    "The check at more steps: same model and recipe, a stretched schedule, its tables recomputed from its runs."
    longer = results["longer"]
    assert longer["setup"]["model"] == results["setup"]["model"]
    steps = longer["setup"]["train"]["max_iters"]
    assert steps >= 2 * results["setup"]["train"]["max_iters"]
    assert longer["setup"]["train"]["warmup_iters"] == steps // 10
    same = {
        k: v for k, v in longer["setup"]["train"].items() if k not in ("max_iters", "warmup_iters", "eval_interval")
    }
    assert same == {k: v for k, v in results["setup"]["train"].items() if k in same}, "only the schedule's length"
    assert all(r["steps"] == steps and r["evals"][-1]["iter"] == steps for r in longer["runs"])
    assert E.summarize(longer["runs"]) == longer["ablations"]
    variants = {r["variant"] for r in longer["runs"]}
    assert {"reference", "unscaled", "rope", "no_positions"} <= variants
    for v in variants:
        assert len([r for r in longer["runs"] if r["variant"] == v]) >= 2, "at least two seeds each"


def _fake_run(variant, seed, loss):
    return {"variant": variant, "seed": seed, "val_loss": loss, "diverged": False, "num_params": 1}


def test_merge_runs_replaces_a_pair_and_keeps_the_rest():
    old = [_fake_run("reference", 0, 2.0), _fake_run("unscaled", 0, 1.9), _fake_run("reference", 1, 2.1)]
    new = [_fake_run("unscaled", 0, 1.8), _fake_run("unscaled", 1, 2.0)]
    got = E.merge_runs(old, new)
    assert [(r["variant"], r["seed"], r["val_loss"]) for r in got] == [
        ("reference", 0, 2.0),
        ("unscaled", 0, 1.8),
        ("reference", 1, 2.1),
        ("unscaled", 1, 2.0),
    ]


def test_merge_results_refuses_another_setup_and_records_the_session():
    setup = E.ablation_setup([0, 1, 2], dict(E.ABLATION_TRAIN))
    old = {"setup": setup, "runs": [_fake_run("reference", s, 2.0 + s / 10) for s in range(3)]}
    new = {
        "date": "d",
        "command": "c",
        "machine": {},
        "total_wall_s": 1.0,
        "setup": E.ablation_setup([3], dict(E.ABLATION_TRAIN)),
        "runs": [_fake_run("reference", 3, 2.3)],
    }
    merged = E.merge_results(old, new)
    assert merged["setup"]["seeds"] == [0, 1, 2, 3], "every variant (here: one) has a run on each"
    old["runs"].append(_fake_run("rope", 0, 1.9))
    assert E.merge_results(old, new)["setup"]["seeds"] == [0], "the seeds every variant has"
    assert [r["seed"] for r in merged["runs"]] == [0, 1, 2, 3]
    assert merged["merged"] == [{"date": "d", "command": "c", "machine": {}, "total_wall_s": 1.0}]
    again = E.merge_results(merged, {**new, "total_wall_s": 2.0})  # the same session, stored again as it goes on
    assert again["merged"] == [{"date": "d", "command": "c", "machine": {}, "total_wall_s": 2.0}]
    fixed = E.merge_results(old, new, seeds=[0, 1])
    assert fixed["setup"]["seeds"] == [0, 1] and all(r["seeds"] == [0] for a in fixed["ablations"] for r in a["rows"])
    longer = {**new, "setup": E.ablation_setup([3], {**E.ABLATION_TRAIN, "max_iters": 2000})}
    with pytest.raises(SystemExit, match="another set-up"):
        E.merge_results(old, longer)


def test_summarize_keeps_the_rows_a_partial_set_of_runs_has():
    runs = [
        _fake_run(v, s, 2.0 + 0.1 * s + (0.05 if v == "rope" else 0)) for v in ("reference", "rope") for s in (0, 1)
    ]
    (positions,) = E.summarize(runs)
    assert positions["name"] == "positions" and [r["variant"] for r in positions["rows"]] == ["reference", "rope"]
    assert positions["rows"][1]["diff_mean"] == pytest.approx(0.05)
    assert E.summarize([r for r in runs if r["variant"] == "rope"]) == [], "no reference, no comparison"


def test_expected_results_json(expected):
    "Every card is consistent with itself (check_card), gives the whole-split loss, the machine and the context."
    cards = {c["name"]: c for c in expected["cards"]}
    assert set(cards) == {"baby-char", "baby-bpe512"}
    for c in cards.values():
        E.check_card(c)
        assert c["steps"] == 2000 and c["context_len"] == 64 and c["batch_size"] == 12
        assert 0.5 < c["bits_per_byte"] < 4 and c["wall_s"] > 0 and c["ms_per_step"] > 0
        assert c["val_curve"][-1][0] == 2000 and c["val_curve"][-1][1] == pytest.approx(c["val_loss_sampled"], abs=1e-3)
        assert abs(c["val_loss"] - c["val_loss_sampled"]) < 0.1, "whole split and 20 batches estimate one loss"
        assert c["machine"]["cpu"] and c["machine"]["torch"] and c["machine"]["threads"] >= 1
    char, bpe = cards["baby-char"], cards["baby-bpe512"]
    assert char["vocab_size"] == 65 and char["val_tokens"] == char["val_chars"] == 111_540  # last 10% of 1,115,394
    assert char["context_chars"] == 64 and char["bits_per_byte"] == char["bits_per_token"]
    assert char["val_bytes"] == char["val_chars"] and bpe["val_bytes"] == bpe["val_chars"]  # the plays are ASCII
    assert bpe["vocab_size"] == 512 and 1.5 < bpe["chars_per_token"] < 3
    assert bpe["context_chars"] == pytest.approx(64 * bpe["chars_per_token"], rel=0.05)


def test_bits_per_byte_recomputed_from_each_cards_own_fields(expected):
    "bits/byte = nats / ln 2 x tokens / bytes, over the whole validation split."
    for c in expected["cards"]:
        cpt = c["val_chars"] / c["val_tokens"]
        assert c["chars_per_token"] == pytest.approx(cpt, abs=1e-4)
        by_hand = c["val_loss"] / math.log(2) * c["val_tokens"] / c["val_bytes"]
        assert c["bits_per_byte"] == pytest.approx(by_hand, abs=2e-4)
        assert c["bits_per_byte"] == pytest.approx(
            E.bits_per_byte(c["val_loss"], c["val_tokens"], c["val_bytes"]), abs=2e-4
        )


@pytest.mark.parametrize(
    "field, value",
    [("bits_per_byte", +0.05), ("chars_per_token", +0.1), ("val_loss", +0.05), ("tokens_per_sec", +100)]
    + [("context_chars", +40.0), ("bits_per_token", -0.01)],
)
def test_check_card_rejects_an_inconsistent_card(expected, field, value):
    bad = {**expected["cards"][-1]}
    bad[field] += value
    with pytest.raises(ValueError, match="inconsistent"):
        E.check_card(bad)


def test_cards_record_where_and_when_their_speed_was_measured(expected):
    for c in expected["cards"]:
        m = c["speed_measured"]
        assert m["machine"]["cpu"] and m["machine"]["torch"] and m["machine"]["threads"] >= 1
        assert m["load_avg_before"] is not None and m["date"] and m["command"].startswith("python bench/experiments.py")


def test_cards_speed_replaces_only_the_speed_fields(tmp_path, expected, monkeypatch, one_thread):
    "--cards-speed trains nothing: the losses, curves and wall times stay, the speed fields and their record change."
    (tmp_path / "expected_results.json").write_text(json.dumps(expected))
    calls = []

    def fake_probe(datasets, steps=20, rounds=5):
        calls.append((sorted(datasets), steps, rounds))
        return {"baby-char": 100.0, "baby-bpe512": 110.0}

    monkeypatch.setattr(E, "speed_probe", fake_probe)
    monkeypatch.setattr(E, "load_token_data", lambda tokenizer, vocab_size=None: (tokenizer, vocab_size))
    E.main(["--cards-speed", "--out", str(tmp_path)])
    assert calls == [(["baby-bpe512", "baby-char"], 20, 5)], "best of 5 interleaved bursts of 20 steps"
    new = json.loads((tmp_path / "expected_results.json").read_text())
    speed = {"ms_per_step", "tokens_per_sec", "chars_per_sec", "speed_measured"}
    for old_card, card in zip(expected["cards"], new["cards"]):
        E.check_card(card)
        assert {k: v for k, v in card.items() if k not in speed} == {
            k: v for k, v in old_card.items() if k not in speed
        }
        assert card["tokens_per_sec"] == round(768 * 1000 / card["ms_per_step"])
        assert card["speed_measured"]["command"] == f"python bench/experiments.py --cards-speed --out {tmp_path}"
    assert [c["ms_per_step"] for c in new["cards"]] == [100.0, 110.0]


def test_check_card_rejects_a_card_without_a_whole_split_loss(expected):
    with pytest.raises(ValueError, match="missing val_loss"):
        E.check_card({**expected["cards"][0], "val_loss": None})


# --- the statistics ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("t, df", [(12.706, 1), (4.303, 2), (3.182, 3), (2.776, 4), (2.571, 5), (2.228, 10)])
def test_t_pvalue_at_textbook_critical_values(t, df):
    "The 97.5% quantiles of Student's t: two-sided p = 0.05 (to the tables' three decimals)."
    assert E.t_pvalue(t, df) == pytest.approx(0.05, abs=2e-4)
    assert E.t_pvalue(-t, df) == E.t_pvalue(t, df) and E.t_pvalue(0.0, df) == pytest.approx(1.0)
    assert E.t_pvalue(2 * t, df) < 0.05 < E.t_pvalue(t / 2, df)


def test_t_pvalue_df2_closed_form():
    for t in (0.5, 3.0, 13.7, 40.0):
        assert E.t_pvalue(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-12)


def test_holm_by_hand():
    # sorted: 0.01 x 4 = 0.04, 0.02 x 3 = 0.06, 0.03 x 2 = 0.06, 0.5 x 1 = 0.5
    assert E.holm([0.03, 0.01, 0.5, 0.02]) == pytest.approx([0.06, 0.04, 0.5, 0.06])
    assert E.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # capped at 1, never below an earlier step


def test_all_comparisons_is_one_family_over_every_ablation_row(results):
    rows = E.all_comparisons(results["ablations"])
    family = [a for a in results["ablations"] if a["name"] not in E.FOLLOW_UPS]
    assert len(rows) == sum(len(a["rows"]) - 1 for a in family) == 17
    for r in rows:
        d = np.array(r["d"])
        assert r["t"] == pytest.approx(d.mean() / (d.std(ddof=1) / math.sqrt(len(d))))
        assert r["p"] <= r["p_holm"] <= 1
        assert r["p_holm"] <= r["p"] * len(rows) + 1e-12  # never stricter than Bonferroni
        assert (r["holm"] != "no measurable difference") == (r["p_holm"] <= 0.05)


def test_recipe_variants_change_only_their_setting(tmp_path):
    base = E.train_config("reference", 0, tmp_path)
    for variant, field, value in [
        ("no_warmup", "warmup_iters", 0),
        ("no_clip", "grad_clip", 0.0),
        ("wd_0", "weight_decay", 0.0),
    ]:
        cfg = E.train_config(variant, 0, tmp_path)
        assert getattr(cfg, field) == value and cfg.replace(**{field: getattr(base, field)}) == base
    assert E.build_model("no_bias", 65, 0).config == E.build_model("reference", 65, 0).config.replace(bias=False)
    assert E.build_model("no_bias", 65, 0).num_params() < E.build_model("reference", 65, 0).num_params()


def test_schedule_variants(tmp_path):
    "Constant: the cosine from the peak to the peak. Linear cool-down: the peak held to 80% of the run, then a line."
    ref, const = E.train_config("reference", 0, tmp_path), E.train_config("constant_lr", 0, tmp_path)
    cool = E.train_config("linear_cooldown", 0, tmp_path)
    peak, floor, n, w = ref.lr, ref.lr * ref.min_lr_ratio, ref.max_iters, ref.warmup_iters
    assert const.replace(min_lr_ratio=ref.min_lr_ratio) == ref and cool == ref, "one change each"
    for t in range(n + 1):
        warm = ref.lr_at(t) if t < w else None
        assert const.lr_at(t) == pytest.approx(warm or peak)
        line = peak - (peak - floor) * max(0, t - 0.8 * n) / (0.2 * n)  # by hand: 640 -> 800
        assert cool.lr_at(t) == pytest.approx(warm or line, rel=1e-12), t
    assert cool.lr_at(639) == cool.lr_at(640) == peak and cool.lr_at(720) == pytest.approx((peak + floor) / 2)
    assert cool.lr_at(n) == ref.lr_at(n) == pytest.approx(floor)


def _sweep_results(loss):
    "A results record for `lr_sweep`: loss(variant, lr, seed) for the sweep's variants and seeds at the three rates."
    rec = {"runs": [], "lr_sweep": {}}
    for lr in (3e-3, *E.SWEEP_LRS):
        runs = [{"variant": v, "seed": s, "val_loss": loss(v, lr, s)} for v in E.SWEEP_VARIANTS for s in E.SWEEP_SEEDS]
        if lr == 3e-3:
            rec["runs"] = runs + [{"variant": "rope", "seed": 4, "val_loss": 0.0}]  # seed 4: not the sweep's
        else:
            rec["lr_sweep"][f"{lr:g}"] = {"runs": runs}
    return rec


def test_lr_sweep_by_hand():
    "Each row: means per rate, paired d at each rate, the best rates; a diverged run is no one's best."
    base = {1e-3: 2.3, 3e-3: 2.1, 1e-2: 2.2, 3e-2: 2.4}
    shift = {"rope": {1e-3: -0.2, 3e-3: -0.1, 1e-2: -0.3, 3e-2: -0.1}, "post_norm": {1e-2: None, 3e-2: None}}

    def loss(v, lr, s):
        d = 0.0 if v == "reference" else shift.get(v, {}).get(lr, 0.01)
        return None if d is None else base[lr] + d + 0.001 * s * (v != "reference")

    rows = {r["variant"]: r for r in E.lr_sweep(_sweep_results(loss))}
    assert rows["reference"]["best_lr"] == 3e-3 and rows["reference"]["mean"] == pytest.approx([2.3, 2.1, 2.2, 2.4])
    rope = rows["rope"]
    assert rope["seeds"] == [0, 1, 2] and rope["best_lr"] == 1e-2  # 2.2 - 0.3 + 0.001 = 1.901
    assert [c["diff_mean"] for c in rope["at_lr"]] == pytest.approx([-0.199, -0.099, -0.299, -0.099])
    assert rope["at_best"]["diff_mean"] == pytest.approx(1.901 - 2.1) and rope["at_best"]["verdict"] == "better"
    post = rows["post_norm"]
    assert post["mean"][2:] == [None, None] and post["at_lr"][2]["verdict"] == "diverged" and post["best_lr"] == 3e-3
    table = E.sweep_table(list(rows.values()), {"rope": "RoPE"})
    assert "| RoPE | 2.101 | 2.001 | **1.901** | 2.301 | -0.199 ± 0.001 better |" in table and "diverged" in table


def test_ablation_table_shows_the_paired_differences_seed_by_seed():
    "The reviewer's case: a difference the rounded losses hide (2.166 vs 2.166) shows in the paired column."
    runs = [_fake_run("reference", s, x) for s, x in enumerate([2.1664, 2.1594, 2.1671])]
    runs += [_fake_run("wd_0", s, x) for s, x in enumerate([2.1656, 2.1579, 2.1636])]
    (recipe,) = E.summarize(runs)
    table = E.ablation_table(recipe)
    assert "| 2.166, 2.158, 2.164 | -0.0008, -0.0015, -0.0035 | -0.002 ± 0.001 (better) |" in table


@pytest.mark.slow
def test_incremental_merge_into_sections(tmp_path, shakespeare_path, one_thread):
    "--merge stores each run as it ends (here: 2 workers); --lr goes to lr_sweep; --reproduce records a rerun."
    args = ["--only", "ablations", "--steps", "4", "--out", str(tmp_path), "--variants", "reference", "linear_cooldown"]
    E.main([*args, "--seeds", "0"])
    first = json.loads((tmp_path / "experiments.json").read_text())
    E.main([*args, "--seeds", "0", "1", "--merge", "--missing", "--workers", "2"])
    whole = json.loads((tmp_path / "experiments.json").read_text())
    assert sorted((r["variant"], r["seed"]) for r in whole["runs"]) == [
        ("linear_cooldown", 0),
        ("linear_cooldown", 1),
        ("reference", 0),
        ("reference", 1),
    ]
    assert [r for r in whole["runs"] if r["seed"] == 0] == first["runs"], "--missing: seed 0 was not rerun"
    assert len(whole["merged"]) == 1 and whole["ablations"][0]["rows"][1]["seeds"] == [0, 1]
    E.main([*args, "--seeds", "0", "--lr", "0.01", "--merge"])
    E.main([*args, "--seeds", "1", "--reproduce"])
    whole = json.loads((tmp_path / "experiments.json").read_text())
    assert [(r["variant"], r["seed"]) for r in whole["lr_sweep"]["0.01"]["runs"]] == [
        ("reference", 0),
        ("linear_cooldown", 0),
    ]
    assert whole["lr_sweep"]["0.01"]["setup"]["train"]["lr"] == 0.01 and len(whole["runs"]) == 4
    assert [f.name for f in tmp_path.iterdir()] == ["experiments.json"], "no lock file or other litter"
    assert [(x["variant"], x["seed"], x["same_curve"]) for x in whole["reproduced"]] == [
        ("reference", 1, True),
        ("linear_cooldown", 1, True),
    ]


def test_decay_embeddings_too_puts_the_embedding_in_the_decayed_group(tmp_path):
    from gptbook.data import TokenData, load_token_data
    from gptbook.train import Trainer

    full = load_token_data("char")
    data = TokenData(full.train[:5_000], full.val[:1_000], full.tokenizer)
    net = E.build_model("wd_embeddings", data.vocab_size, 0)
    trainer = Trainer(net, data, E.train_config("wd_embeddings", 0, tmp_path))
    before = trainer.optimizer.param_groups[0]["params"]
    assert not any(p is net.wte.weight for p in before), "the book's rule: the embedding is not decayed"
    E.decay_embeddings_too(trainer)
    decayed, plain = trainer.optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert any(p is net.wte.weight for p in decayed["params"]) and any(p is net.wpe.weight for p in decayed["params"])
    assert {id(p) for p in before} < {id(p) for p in decayed["params"]}, "every matrix the book decays still decays"
    assert all(p.dim() < 2 for p in plain["params"])
    n = len({id(p) for p in net.parameters()})
    assert len(decayed["params"]) + len(plain["params"]) == n


# --- the chapter shows exactly the committed results ---------------------------------------------------


def test_chapter_tables_match_results(results, expected):
    shown = _notebook_outputs()
    for a in results["ablations"]:
        assert E.ablation_table(a) in shown, f"the chapter's {a['name']} table is stale: re-execute the notebook"
        assert a["conclusion"] in shown
    assert E.cards_table(expected["cards"]) in shown, "the chapter's cards table is stale: re-execute the notebook"
    assert E.comparisons_table(E.all_comparisons(results["ablations"])) in shown, "the Holm table is stale"
    assert E.sweep_table(E.lr_sweep(results), SWEEP_LABELS) in shown, "the learning-rate table is stale"


SWEEP_LABELS = {"reference": "reference", "post_norm": "post-norm", "unscaled": "unscaled attention"}
SWEEP_LABELS |= {"rope": "RoPE", "no_positions": "no positions", "swiglu": "SwiGLU", "no_bias": "no biases"}


def test_numbers_quoted_in_the_prose_are_in_the_tables(results):
    "Every 'mean ± spread' the chapter's text quotes is one of the measured differences (sign aside)."
    import re

    nb = json.loads(NOTEBOOK.read_text())
    prose = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    quoted = re.findall(r"(\d\.\d{3}) ± (\d\.\d{3})", prose)
    assert len(quoted) >= 5, "the conclusions quote the measured differences"
    tables = "\n".join(E.ablation_table(a) for a in results["ablations"])
    tables += "\n" + E.sweep_table(E.lr_sweep(results), SWEEP_LABELS)
    for mean, spread in quoted:
        assert f"{mean} ± {spread}" in tables, f"the text quotes {mean} ± {spread}, which no table shows"


# --- the pieces of the script ---------------------------------------------------------------------------


def _unscaled_attention_by_hand(attn, x, rope=None):
    "softmax(q k^T) v (no 1/sqrt(d_k)), causal, from the layer's weights: einsum, no hooks, no SDPA."
    B, T, C = x.shape
    nh, hd = attn.n_heads, attn.head_dim
    qkv = torch.nn.functional.linear(x, attn.c_attn.weight, attn.c_attn.bias)
    q, k, v = (t.reshape(B, T, nh, hd).permute(0, 2, 1, 3) for t in qkv.split(C, dim=-1))
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k)
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)
    return torch.nn.functional.linear(y.permute(0, 2, 1, 3).reshape(B, T, C), attn.c_proj.weight, attn.c_proj.bias)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_unscale_attention_hook(positions):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.baby(65, d_model=64, positions=positions)).double()
    for p in gpt.parameters():
        p.data.normal_(0, 0.3)  # large weights: the scale changes the output a lot
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    attn = gpt.blocks[1].attn
    rope = None if positions == "learned" else gpt.wpe.angles(9)
    with torch.no_grad():
        before = attn(x, rope=rope)
        handles = E.unscale_attention(gpt)
        after = attn(x, rope=rope)
        torch.testing.assert_close(after, _unscaled_attention_by_hand(attn, x, rope), rtol=1e-9, atol=1e-9)
        assert (after - before).abs().max() > 1e-3, "the hook must change the layer"
        for h in handles:
            h.remove()
        torch.testing.assert_close(attn(x, rope=rope), before, rtol=0, atol=0)
    assert len(handles) == gpt.config.n_layers


def test_build_model_variants():
    for name, spec in E.VARIANTS.items():
        m = E.build_model(name, 65, seed=0)
        for field, value in spec["model"].items():
            assert getattr(m.config, field) == value
        assert m.config.d_model == E.ABLATION_MODEL["d_model"] and m.config.n_layers == E.ABLATION_MODEL["n_layers"]
    # same seed, same architecture: the same initial weights
    a, b = E.build_model("reference", 65, 3), E.build_model("reference", 65, 3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    # SwiGLU at (nearly) GELU's parameter count: within 1% of the reference model
    ratio = E.build_model("swiglu", 65, 0).num_params() / E.build_model("reference", 65, 0).num_params()
    assert abs(ratio - 1) < 0.01


def test_query_scale_variants_are_the_two_halves_of_unscaled():
    "At initialization q_lr_x4 computes the reference's function and q_init_x4 the unscaled model's (x4 and /4: exact)."
    idx = torch.randint(0, 65, (2, 16))
    with torch.no_grad():
        out = {v: E.build_model(v, 65, 3)(idx) for v in ("reference", "unscaled", "q_init_x4", "q_lr_x4")}
    torch.testing.assert_close(out["q_lr_x4"], out["reference"], rtol=0, atol=1e-6)
    torch.testing.assert_close(out["q_init_x4"], out["unscaled"], rtol=0, atol=1e-6)
    assert not torch.allclose(out["unscaled"], out["reference"], atol=1e-6)
    ref, big = E.build_model("reference", 65, 3), E.build_model("q_init_x4", 65, 3)
    q = ref.blocks[0].attn.n_heads * ref.blocks[0].attn.head_dim
    for a, b in zip(ref.blocks, big.blocks):
        assert torch.equal(4 * a.attn.c_attn.weight[:q], b.attn.c_attn.weight[:q])
        assert torch.equal(a.attn.c_attn.weight[q:], b.attn.c_attn.weight[q:]), "keys and values untouched"


def test_embed_scale_variant_differs_from_sinusoidal_by_the_switch_only(results):
    "The 2017 remedy: the sinusoidal variant's model, weights and all, with embed_scale on; its runs are stored."
    plain, scaled = E.build_model("sinusoidal", 65, 1), E.build_model("sinusoidal_embed_scale", 65, 1)
    assert scaled.config == plain.config.replace(embed_scale=True) and not plain.config.embed_scale
    assert all(torch.equal(p, q) for p, q in zip(plain.state_dict().values(), scaled.state_dict().values()))
    idx = torch.randint(0, 65, (1, 8))
    with torch.no_grad():
        assert not torch.allclose(plain(idx), scaled(idx))
    rows = {r["variant"]: r for r in next(a for a in results["ablations"] if a["name"] == "positions")["rows"]}
    assert rows["sinusoidal_embed_scale"]["seeds"] == rows["sinusoidal"]["seeds"] == results["setup"]["seeds"]


def test_bits_per_byte_against_a_direct_count():
    "Two bytes per token, each token predicted with probability 1/4: 2 bits per token, 1 bit per byte."
    tokens = ["ab", "cd", "é"]  # é is two bytes in UTF-8
    nats = [-math.log(0.25)] * len(tokens)
    direct = sum(n / math.log(2) for n in nats) / sum(len(t.encode()) for t in tokens)
    assert E.bits_per_byte(sum(nats) / len(nats), len(tokens), 6) == pytest.approx(direct) == pytest.approx(1.0)


def test_full_val_loss_is_the_mean_over_every_window():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.baby(11, d_model=16, n_layers=1, n_heads=2, max_seq_len=8)).eval()
    val = np.random.default_rng(0).integers(0, 11, size=8 * 5 + 3).astype(np.uint16)
    got = E.full_val_loss(gpt, val, 8, batch_size=2)  # batches of 2 windows, one left over
    ids = torch.as_tensor(val.astype(np.int64))
    with torch.no_grad():
        losses = [
            torch.nn.functional.cross_entropy(gpt(ids[i : i + 8][None])[0], ids[i + 1 : i + 9], reduction="sum")
            for i in range(0, 40, 8)
        ]
    assert got == pytest.approx(sum(loss.item() for loss in losses) / 40, rel=1e-6)


def test_compare_verdicts():
    assert E.compare([2.0, 2.1, 2.2], [2.1, 2.21, 2.29])["verdict"] == "worse"
    assert E.compare([2.0, 2.1, 2.2], [1.9, 1.98, 2.11])["verdict"] == "better"
    assert E.compare([2.0, 2.1, 2.2], [2.01, 2.09, 2.2])["verdict"] == "no measurable difference"  # signs differ
    assert E.compare([2.0, 2.1, 2.2], [2.01, 2.2, 2.21])["verdict"] == "no measurable difference"  # too noisy
    assert E.compare([2.0], [2.5])["verdict"] == "one seed: no verdict"
    assert E.compare([2.0, 2.1], [None, 2.0])["verdict"] == "diverged"


def test_run_one_smoke(shakespeare_path, one_thread):
    from gptbook.data import TokenData, load_token_data

    full = load_token_data("char")
    data = TokenData(full.train[:50_000], full.val[:2_000], full.tokenizer)  # a slice: the pipeline, not the loss
    r = E.run_one("unscaled", 0, data, train={"max_iters": 4, "warmup_iters": 1, "eval_interval": 2, "eval_iters": 1})
    assert r["steps"] == 4 and not r["diverged"] and r["val_loss"] < math.log(65) + 0.1
    assert [e["iter"] for e in r["evals"]] == [0, 2, 4]
    assert r["curve"]["step"] == [4]


@pytest.mark.slow
def test_quick_mode_writes_well_formed_results(tmp_path, shakespeare_path, one_thread):
    E.main(["--quick", "--out", str(tmp_path)])
    check_experiments(json.loads((tmp_path / "experiments.json").read_text()), seeds=[0], steps=20)
    cards = json.loads((tmp_path / "expected_results.json").read_text())["cards"]
    assert [c["name"] for c in cards] == ["baby-char", "baby-bpe512"] and all(c["steps"] == 20 for c in cards)
