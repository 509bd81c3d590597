"""The `gptbook` command: help, one-line errors, train -> sample end to end, resume, sampling options."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptbook.cli import build_parser, main
from gptbook.checkpoint import load_checkpoint
from gptbook.runs import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--n-layers",
    "1",
    "--n-heads",
    "2",
    "--d-model",
    "32",
    "--max-seq-len",
    "32",
    "--batch-size",
    "4",
    "--eval-iters",
    "2",
    "--no-progress",
]


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def run_cli(*argv, timeout=300):
    "Run `python -m gptbook *argv` in a fresh process (the way a user does)."
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gptbook", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def call(capsys, *argv):
    "Run `main(argv)` in this process; returns (status, stdout, stderr)."
    try:
        status = main([str(a) for a in argv])
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, shakespeare_path):
    "A tiny model trained for 20 steps by the real command, in a subprocess."
    out = tmp_path_factory.mktemp("cli") / "run"
    r = run_cli("train", "--out", out, "--max-iters", 20, "--eval-interval", 10, "--sample-tokens", 50, *TINY)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def test_help_lists_every_flag(capsys):
    status, out, _ = call(capsys, "train", "--help")
    assert status == 0
    for flag in [
        "--data",
        "--tokenizer",
        "--bpe-vocab-size",
        "--preset",
        "--n-layers",
        "--n-heads",
        "--d-model",
        "--max-seq-len",
        "--dropout",
        "--max-iters",
        "--batch-size",
        "--grad-accum",
        "--lr",
        "--warmup-iters",
        "--device",
        "--dtype",
        "--compile",
        "--out",
        "--resume",
        "--seed",
        "--eval-interval",
        "--eval-iters",
    ]:
        assert flag in out, flag
    assert "(default: 2000)" in out and "(default: 12)" in out  # the baby run's defaults are shown
    status, out, _ = call(capsys, "sample", "--help")
    for flag in [
        "--out",
        "--prompt",
        "--max-new-tokens",
        "--temperature",
        "--top-p",
        "--top-k",
        "--seed",
        "--num-samples",
        "--stream",
        "--device",
    ]:
        assert flag in out, flag
    assert "0.8" in out and "0.9" in out


def _flags(parser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")}


def _field_flags(cls) -> set[str]:
    import dataclasses

    fields = [f for f in dataclasses.fields(cls) if f.metadata.get("cli", True)]
    return {f.metadata.get("flag") or "--" + f.name.replace("_", "-") for f in fields}


def test_flags_are_the_config_fields():
    "Every field of the three configs has a flag, with help text; the only other flags are the commands' own."
    import dataclasses

    from gptbook.model import GPTConfig
    from gptbook.sample import SamplingConfig
    from gptbook.train import TrainConfig

    commands = build_parser()._subparsers._group_actions[0].choices
    train_flags, sample_flags = _flags(commands["train"]), _flags(commands["sample"])
    negations = {f"--no-{f.name.replace('_', '-')}" for c in (TrainConfig, GPTConfig) for f in dataclasses.fields(c)}
    extra = train_flags - _field_flags(TrainConfig) - _field_flags(GPTConfig) - negations
    assert extra == {"--help", "--resume", "--overwrite", "--config", "--sample-tokens"}
    assert _field_flags(TrainConfig) | _field_flags(GPTConfig) <= train_flags
    assert {"--out", "--data"} <= _field_flags(TrainConfig)  # the contract's names for out_dir and data_path
    assert _field_flags(SamplingConfig) <= sample_flags
    own = {"--help", "--out", "--prompt", "--seed", "--num-samples", "--stream", "--no-stream", "--device"}
    own |= {"--hf", "--nanogpt", "--tokenizer"}  # other models than a run's
    negations = {f"--no-{f.name.replace('_', '-')}" for f in dataclasses.fields(SamplingConfig)}
    assert sample_flags - _field_flags(SamplingConfig) - negations == own
    for cls in (TrainConfig, GPTConfig, SamplingConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"


def test_version(capsys):
    import gptbook

    status, out, _ = call(capsys, "--version")
    assert status == 0 and out.strip() == f"gptbook {gptbook.__version__}"


def test_bad_field_value_names_the_flag(capsys):
    status, _, err = call(capsys, "train", "--norm-eps", "nan")
    assert status == 1 and err.startswith("gptbook train: error: --norm-eps: norm_eps must be")
    status, _, err = call(capsys, "train", "--n-layers", "0")
    assert status == 1 and "--n-layers: n_layers must be at least 1" in err


def test_optional_fields_take_none(capsys):
    from gptbook.cli import sampling_config_from_args

    parser = build_parser()
    args = parser.parse_args(
        ["sample", "--top-p", "none", "--top-k", "5", "--stop-strings", "THE END", "--stop-strings", "FINIS"]
    )
    config = sampling_config_from_args(args)
    assert (config.top_p, config.top_k, config.temperature) == (None, 5, 0.8)
    assert config.stop_strings == ("THE END", "FINIS")


def test_config_replays_a_run(tmp_path, capsys, shakespeare_path):
    "`--config RUN` trains the run of RUN's config.json again: the same losses; flags still override it."
    first = tmp_path / "first"
    argv = ["--max-iters", 6, "--eval-interval", 3, "--sample-tokens", 0, *TINY]
    assert call(capsys, "train", "--out", first, *argv)[0] == 0
    assert call(capsys, "train", "--config", first, "--out", tmp_path / "again", "--sample-tokens", 0)[0] == 0
    assert read_metrics(first) and [r["val_loss"] for r in read_metrics(first)] == [
        r["val_loss"] for r in read_metrics(tmp_path / "again")
    ]
    status, _, err = call(capsys, "train", "--config", first, "--out", tmp_path / "more", "--max-iters", 3)
    assert status == 0, err
    assert read_metrics(tmp_path / "more")[-1]["iter"] == 3
    assert load_checkpoint(tmp_path / "more").model.config.n_layers == 1


def test_no_command_prints_help(capsys):
    status, out, _ = call(capsys)
    assert status == 2 and "train" in out and "sample" in out


@pytest.mark.parametrize(
    "argv, status, text",
    [
        (["train", "--max-iterz", "5"], 2, "unrecognized arguments: --max-iterz"),
        (["train", "--lr", "fast"], 2, "invalid float value: 'fast'"),
        (["train", "--tokenizer", "words"], 1, "error: tokenizer='words' is neither 'char', 'bpe' nor a tokenizer"),
        (["train", "--batch-size", "0"], 1, "batch_size must be at least 1"),
        (["train", "--data", "/no/such/file.txt"], 1, "/no/such/file.txt does not exist"),
        (["train", "--preset", "baby", "--n-layerz", "1"], 2, "unrecognized arguments"),
        (["train", "--dtype", "float16"], 2, "invalid choice: 'float16'"),
        (["sample", "--out", "/no/such/run"], 1, "/no/such/run does not exist"),
        (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, status, text):
    got, out, err = call(capsys, *argv)
    assert got == status
    assert len(err.strip().splitlines()) == 1 and text in err and "Traceback" not in err


def test_errors_from_a_real_process_are_one_line(tmp_path):
    r = run_cli("sample", "--out", tmp_path / "missing")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "gptbook train --out" in r.stderr


@pytest.mark.slow
def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "gptbook"
    if not exe.exists():
        pytest.skip("the gptbook console script is installed by `pip install -e .`")
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "train" in r.stdout and "sample" in r.stdout


def test_train_then_sample_end_to_end(run_dir):
    out, r = run_dir
    recs = read_metrics(out)
    assert [x["iter"] for x in recs] == [0, 10, 20]
    assert "a sample from the model at step 20" in r.stdout
    lines = r.stdout.rstrip("\n").splitlines()
    assert lines[-1] == f"more text: gptbook sample {out}"  # one closing line names the command, once
    assert sum("gptbook sample" in line for line in lines) == 1, r.stdout
    assert load_checkpoint(out).iter == 20
    s = run_cli("sample", "--out", out, "--prompt", "ROMEO:", "--max-new-tokens", 30, "--seed", 1)
    assert s.returncode == 0, s.stderr[-2000:]
    assert s.stdout.startswith("ROMEO:") and len(s.stdout.rstrip("\n")) == len("ROMEO:") + 30


def test_sample_options(run_dir, capsys):
    out, _ = run_dir
    base = ["sample", "--out", out, "--prompt", "KING", "--max-new-tokens", 25, "--device", "cpu"]
    s1, a, _ = call(capsys, *base, "--seed", 3)
    s2, b, _ = call(capsys, *base, "--seed", 3)
    s3, c, _ = call(capsys, *base, "--seed", 4)
    assert s1 == s2 == s3 == 0 and a == b and a != c
    # greedy decoding ignores the seed
    assert (
        call(capsys, *base, "--temperature", 0, "--seed", 1)[1]
        == call(capsys, *base, "--temperature", 0, "--seed", 2)[1]
    )
    status, text, _ = call(capsys, *base, "--num-samples", 3, "--seed", 1, "--top-k", 5, "--top-p", 1.0)
    assert status == 0 and text.count("---------------") == 2 and text.count("KING") >= 3
    status, streamed, _ = call(capsys, *base, "--seed", 3, "--stream")
    assert status == 0 and streamed == a  # streaming prints the same text, piece by piece


@pytest.mark.parametrize(
    "argv, text",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "1.5"], "top_p"),
        (["--top-k", "0"], "top_k"),
        (["--prompt", ""], "prompt"),
        (["--prompt", "日本"], "this CharTokenizer was trained on"),
        (["--num-samples", "0"], "--num-samples"),
        (["--max-new-tokens", "2000000000"], "max_new_tokens must be in [0, 1000000], got 2000000000"),
    ],
)
def test_bad_sampling_options_are_one_line(run_dir, capsys, argv, text):
    out, _ = run_dir
    status, _, err = call(capsys, "sample", "--out", out, "--max-new-tokens", 5, *argv)
    assert status == 1 and len(err.strip().splitlines()) == 1 and text in err


def test_sample_streams_at_once_on_a_terminal(run_dir):
    "On a terminal the text comes as it is generated: a million new tokens start printing at once, no silent wait."
    import pty
    import select
    import time

    out, _ = run_dir
    argv = ["sample", "--out", out, "--prompt", "KING", "--max-new-tokens", 1_000_000, "--device", "cpu"]
    master, terminal = pty.openpty()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "gptbook", *map(str, argv)], stdout=terminal, env=env, cwd=ROOT)
    os.close(terminal)
    seen, deadline = b"", time.monotonic() + 120  # the start of Python and torch, then a few tokens
    try:
        while len(seen) < len("KING") + 20 and time.monotonic() < deadline and p.poll() is None:
            if select.select([master], [], [], 1)[0]:
                seen += os.read(master, 1024)
    finally:
        p.kill()
        p.wait()
        os.close(master)
    assert seen.startswith(b"KING") and len(seen) >= len("KING") + 20, seen


def test_sample_prints_the_whole_text_at_the_end_into_a_pipe(run_dir):
    "Not a terminal: no streaming unless --stream; the text is the same either way."
    out, _ = run_dir
    argv = ["sample", "--out", out, "--prompt", "KING", "--max-new-tokens", 30, "--seed", 2]
    whole, streamed = run_cli(*argv), run_cli(*argv, "--stream")
    assert whole.returncode == streamed.returncode == 0 and whole.stdout == streamed.stdout


@pytest.mark.parametrize("preset", [[], ["--preset", "gpt2-small"], ["--preset=llama-style"]])
def test_train_help_shows_the_model_a_run_builds(capsys, preset):
    "Each model flag of `gptbook train --help` shows the value of the model that the same command line builds."
    import dataclasses

    from gptbook.cli import _default_text, _preset_in, config_from_args
    from gptbook.model import GPTConfig

    status, text, _ = call(capsys, "train", *preset, "--help")
    assert status == 0
    parser = build_parser("train", _preset_in(preset))
    cfg = config_from_args(parser.parse_args(["train", *preset]))
    model = GPTConfig.from_preset(cfg.preset, 65, **cfg.model_overrides)  # what `train` builds on 65 characters
    actions = {a.dest: a for a in parser._subparsers._group_actions[0].choices["train"]._actions}
    for f in dataclasses.fields(GPTConfig):
        shown = "the tokenizer's size" if f.name == "vocab_size" else _default_text(f, getattr(model, f.name))
        assert actions[f.name].help.endswith(f"(default: {shown})"), (f.name, actions[f.name].help)
    flat = " ".join(text.split())
    assert f"--n-layers N number of transformer blocks (default: {model.n_layers})" in flat
    assert f"the {cfg.preset} preset unless given" in flat
    if not preset:
        assert (model.n_layers, model.d_model, model.max_seq_len) == (4, 128, 64)  # the baby, not GPT-2 small


def test_resume_extends_a_run(tmp_path, capsys, shakespeare_path):
    out = tmp_path / "run"
    status, _, err = call(
        capsys, "train", "--out", out, "--max-iters", 10, "--eval-interval", 5, "--sample-tokens", 0, *TINY
    )
    assert status == 0, err
    status, stdout, err = call(
        capsys, "train", "--out", out, "--resume", "--max-iters", 15, "--no-progress", "--sample-tokens", 0
    )
    assert status == 0, err
    assert [r["iter"] for r in read_metrics(out)] == [0, 5, 10, 15] and "step 15" in stdout
    assert stdout.rstrip("\n").splitlines()[-1] == f"sample: gptbook sample {out}"  # no sample printed: no "more"
    ck = load_checkpoint(out)
    assert ck.iter == 15 and ck.model.config.n_layers == 1 and ck.state["train_config"]["max_iters"] == 15
    status, _, err = call(capsys, "train", "--out", out, "--resume", "--d-model", "64")
    assert status == 1 and "--d-model" in err and len(err.strip().splitlines()) == 1
    status, _, err = call(capsys, "train", "--out", tmp_path / "nothing", "--resume")
    assert status == 1 and "gptbook train --out" in err


def test_parser_maps_flags_to_configs():
    from gptbook.cli import config_from_args

    args = build_parser().parse_args(
        ["train", "--n-layers", "2", "--no-bias", "--lr", "3e-4", "--out", "x", "--data", "t.txt"]
    )
    cfg = config_from_args(args)
    assert not args.resume and cfg.model_overrides == {"n_layers": 2, "bias": False}
    assert (cfg.lr, cfg.out_dir, cfg.data_path, cfg.max_iters) == (3e-4, "x", "t.txt", 2000)


def test_bad_device_leaves_the_earlier_run_alone(capsys, run_dir, tmp_path):
    "A fresh run that cannot start (no CUDA here) must fail before it removes the checkpoints already in --out."
    import shutil

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: 'cuda' is not a bad device here")
    out = tmp_path / "run"
    shutil.copytree(run_dir[0], out)
    before = sorted(p.name for p in out.iterdir())
    status, _, err = call(capsys, "train", "--out", out, "--device", "cuda", "--overwrite", *TINY)
    assert status == 1 and "no CUDA GPU" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == before


def test_text_without_newline_still_trains_and_samples(capsys, tmp_path):
    "The closing sample starts from a newline; a vocabulary without one must not turn a good run into exit 1."
    text = tmp_path / "abc.txt"
    text.write_text("abcabcabdabcacbabcabcbbacabcabcabc" * 40)
    status, out, err = call(
        capsys,
        "train",
        "--data",
        text,
        "--out",
        tmp_path / "run",
        "--max-iters",
        2,
        "--eval-interval",
        1,
        "--sample-tokens",
        5,
        *TINY,
    )
    assert status == 0, err
    assert "a sample from the model" in out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-iters", "0"], "max_iters must be at least 1"),
        (["--out", "/dev/null/run"], "gptbook train: error:"),
        (["--weight-decay", "-1"], "weight_decay must be >= 0"),
        (["--grad-clip", "-1"], "grad_clip must be >= 0"),
    ],
)
def test_more_one_line_errors(capsys, tmp_path, flags, message):
    status, _, err = call(capsys, "train", "--out", tmp_path / "r", *TINY, *flags)
    assert status == 1 and message in err and "Traceback" not in err


@pytest.mark.parametrize("damage", ["model.safetensors", "state.json"])
def test_damaged_checkpoint_is_one_line_naming_the_file(capsys, run_dir, tmp_path, damage):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run_dir[0], out)
    (ckpt,) = [p for p in out.iterdir() if p.name.startswith("ckpt_")]
    f = ckpt / damage
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])  # truncated, as by a disk that filled up
    status, _, err = call(capsys, "sample", "--out", out, "--max-new-tokens", 5)
    assert status == 1 and damage in err and "damaged" in err and "Traceback" not in err


# --- issue 13: eval, tokenizer train, sample RUN / --hf / --nanogpt, train --init-from ---------------------------


def _numbers(out: str) -> tuple[float, float, float]:
    "loss, perplexity and bits/char from the output of `gptbook eval`."
    import re

    m = re.search(r"loss ([\d.]+) nats/token, perplexity ([\d.]+), ([\d.]+) bits/char", out)
    assert m, out
    return tuple(float(x) for x in m.groups())


def test_eval_scores_the_whole_file(capsys, run_dir, shakespeare_path, tmp_path):
    "The loss is the mean over every token but the first (checked by a plain loop), whatever the batch size."
    import math

    from gptbook.model import lm_loss

    text = Path(shakespeare_path).read_text(encoding="utf-8")[:3000]
    f = tmp_path / "t.txt"
    f.write_text(text, encoding="utf-8")
    s1, out1, err = call(capsys, "eval", run_dir[0], "--data", f, "--batch-size", 1)
    s7, out7, _ = call(capsys, "eval", "--out", run_dir[0], "--data", f, "--batch-size", 7)
    assert s1 == s7 == 0, err
    loss, ppl, bpc = _numbers(out1)
    assert _numbers(out7) == pytest.approx((loss, ppl, bpc), abs=2e-4)
    ckpt = load_checkpoint(run_dir[0])
    ids = torch.tensor(ckpt.tokenizer.encode(text))
    T, nats = ckpt.model.config.max_seq_len, 0.0
    with torch.no_grad():
        for i in range(0, len(ids) - 1, T):  # one window at a time
            x, y = ids[i : i + T][None], ids[i + 1 : i + 1 + T][None]
            x = x[:, : y.shape[1]]
            nats += lm_loss(ckpt.model(x), y).item() * y.numel()
    assert loss == pytest.approx(nats / (len(ids) - 1), abs=1e-4)
    assert ppl == pytest.approx(math.exp(loss), rel=1e-3)
    assert bpc == pytest.approx(nats / math.log(2) / len(text), abs=1e-4)


def one_line(status, err, *texts):
    "The command failed with status 1 and one line of stderr holding every one of `texts`."
    assert status == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(str(t) in err for t in texts), (texts, err)


def test_eval_errors_are_one_line(capsys, run_dir, tmp_path):
    status, _, err = call(capsys, "eval", run_dir[0], "--data", tmp_path / "none.txt")
    one_line(status, err, "none.txt does not exist")
    status, _, err = call(capsys, "eval", run_dir[0])
    one_line(status, err, "give one")  # neither --data nor --task
    (tmp_path / "binary.bin").write_bytes(b"\xa9\x00\xff")
    for bad, text in (
        (tmp_path / "binary.bin", "binary.bin is not UTF-8 text (byte 0xa9"),
        ("/dev/zero", "not a regular"),
    ):
        one_line(*call(capsys, "eval", run_dir[0], "--data", bad)[::2], text)
        one_line(*call(capsys, "tokenizer", "train", bad, "--vocab-size", 300, "--out", tmp_path / "t.json")[::2], text)
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    status, _, err = call(
        capsys, "tokenizer", "train", tmp_path / "empty.txt", "--vocab-size", 300, "--out", tmp_path / "t.json"
    )
    one_line(status, err, "empty.txt is empty")


def test_a_prompt_with_a_special_token_is_refused_in_the_cli_s_words(capsys, tmp_path):
    "The tokenizer's advice names Python keywords (allowed_special=...); the command has no such flag."
    from gptbook.config import GPTConfig
    from gptbook.hf import save_hf
    from gptbook.model import GPT
    from gptbook.tokenizer import BPETokenizer

    tok = BPETokenizer.train("hello world " * 50, 300, special_tokens=["<|endoftext|>"])
    save_hf(
        GPT(GPTConfig(vocab_size=tok.vocab_size, max_seq_len=16, n_layers=1, n_heads=2, d_model=16)),
        tmp_path / "m",
        tok,
    )
    status, _, err = call(capsys, "sample", "--hf", tmp_path / "m", "--prompt", "<|endoftext|>hello", "--device", "cpu")
    one_line(status, err, "--prompt contains the special token '<|endoftext|>'", "plain text")
    assert "allowed_special" not in err


def test_eval_bounds_its_memory_whatever_the_batch_size(capsys, run_dir, tmp_path, shakespeare):
    "--batch-size 1000000 once allocated every window's logits at once; now a budget caps the batch: same score."
    f = tmp_path / "part.txt"
    f.write_text(shakespeare[:3000], encoding="utf-8")
    s1, out1, err = call(capsys, "eval", run_dir[0], "--data", f, "--batch-size", 1)
    s2, out2, err = call(capsys, "eval", run_dir[0], "--data", f, "--batch-size", 1_000_000)
    assert s1 == s2 == 0, err
    assert _numbers(out1) == pytest.approx(_numbers(out2), abs=2e-4)


def test_a_model_with_nan_weights_is_refused_never_scored(capsys, run_dir, tmp_path):
    import json as json_

    from safetensors.torch import load_file, save_file

    from gptbook.files import sha256_of

    run = tmp_path / "nan"
    shutil.copytree(run_dir[0], run)
    folder = load_checkpoint(run).path
    weights = {k: torch.full_like(v, float("nan")) for k, v in load_file(folder / "model.safetensors").items()}
    save_file(weights, folder / "model.safetensors")  # a forger's NaN weights, with a consistent SHA-256
    state = json_.loads((folder / "state.json").read_text())
    state["sha256"]["model.safetensors"] = sha256_of(folder / "model.safetensors")
    (folder / "state.json").write_text(json_.dumps(state))
    for argv in (
        ["eval", run, "--data", run / "config.json"],
        ["sample", run],
        ["train", "--out", tmp_path / "ft", "--init-from", run],
    ):
        one_line(*call(capsys, *argv)[::2], "holds NaN or infinite values")


@pytest.mark.parametrize(
    "flags, text",
    [
        (["--d-model", "100000", "--n-heads", "1", "--n-layers", "1"], "--d-model: d_model=100,000 makes a model of"),
        (["--batch-size", "100000"], "--batch-size: batch_size=100000 x context 64 needs about"),
        (["--init-from", ""], "--init-from: init_from must be a non-empty string"),
    ],
)
def test_sizes_and_empty_values_are_refused_before_anything_is_allocated(capsys, tmp_path, flags, text):
    status, out, err = call(capsys, "train", "--out", tmp_path / "big", *flags)
    one_line(status, err, text, "more than this machine" if "make" in text or "needs" in text else "")
    assert out == "" and not (tmp_path / "big").exists()


def test_init_from_a_longer_context_than_the_weights_is_refused_before_training(capsys, run_dir, tmp_path):
    status, out, err = call(capsys, "train", "--out", tmp_path / "ft", "--init-from", run_dir[0], "--context-len", 64)
    one_line(status, err, "context_len=64 is longer than the model's learned position table (max_seq_len=32)")
    assert out == ""


def test_a_tokenizer_of_another_size_than_the_runs_is_refused(capsys, run_dir, tmp_path):
    from gptbook.tokenizer import CharTokenizer

    CharTokenizer(["a", "b"]).save(tmp_path / "ab.json")
    one_line(*call(capsys, "sample", run_dir[0], "--tokenizer", tmp_path / "ab.json")[::2], "has 2 ids, but the run")


def test_a_missing_optional_package_is_one_line_naming_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if it were not installed
    one_line(*call(capsys, "sample", "--hf", "openai-community/gpt2")[::2], "gptbook[hf]")


def test_warnings_are_one_line_too(capsys, tmp_path):
    (tmp_path / "tiny.txt").write_text("ab" * 20, encoding="utf-8")
    status, out, err = call(
        capsys, "tokenizer", "train", tmp_path / "tiny.txt", "--vocab-size", 400, "--out", tmp_path / "t.json"
    )
    assert status == 0 and err.startswith("gptbook tokenizer: warning: ") and len(err.strip().splitlines()) == 1, err
    argv = ["tokenizer", "train", tmp_path / "tiny.txt", "--vocab-size", 256, "--out", tmp_path]
    one_line(*call(capsys, *argv)[::2], "is a folder")


def test_tokenizer_train(capsys, shakespeare_path, tmp_path):
    from gptbook.tokenizer import load_tokenizer

    text = tmp_path / "t.txt"
    text.write_text(Path(shakespeare_path).read_text(encoding="utf-8")[:20000], encoding="utf-8")
    status, out, err = call(capsys, "tokenizer", "train", text, "--vocab-size", 300, "--out", tmp_path / "tok.json")
    assert status == 0, err
    tok = load_tokenizer(tmp_path / "tok.json")
    assert tok.vocab_size == 300 and tok.decode(tok.encode("ROMEO: hi")) == "ROMEO: hi"
    status, _, _ = call(
        capsys, "tokenizer", "train", text, "--vocab-size", 300, "--out", tmp_path / "raw.json", "--no-pattern"
    )
    raw = load_tokenizer(tmp_path / "raw.json")
    assert status == 0 and raw.merges != tok.merges  # merges across word boundaries now
    status, _, err = call(capsys, "tokenizer", "train", text, "--vocab-size", 100, "--out", tmp_path / "x.json")
    assert status == 1 and "at least 256" in err and not (tmp_path / "x.json").exists()


def test_sample_takes_the_run_as_an_argument(capsys, run_dir):
    base = ["--max-new-tokens", 20, "--seed", 5]
    s1, a, _ = call(capsys, "sample", run_dir[0], *base)
    s2, b, _ = call(capsys, "sample", "--out", run_dir[0], *base)
    assert s1 == s2 == 0 and a == b
    status, _, err = call(capsys, "sample", run_dir[0], "--out", run_dir[0].parent, *base)
    assert status == 1 and "give one" in err


def test_sample_nanogpt_needs_a_tokenizer(capsys, tmp_path):
    status, _, err = call(capsys, "sample", "--nanogpt", tmp_path / "ckpt.pt")
    assert status == 1 and "--tokenizer" in err and "meta.pkl" in err and len(err.strip().splitlines()) == 1
    assert "--char for a character model" in err and "--vocab-size N for a BPE" in err  # F12: nanoGPT's char models
    status, _, err = call(capsys, "sample", "--nanogpt", tmp_path / "ckpt.pt", "--hf", tmp_path)
    assert status == 1 and "give one model" in err


def test_sample_nanogpt_checkpoint(capsys, tmp_path, shakespeare_path):
    "A ckpt.pt in nanoGPT's format (as test_hf builds one) samples the text that nanoGPT's own forward pass picks."
    pytest.importorskip("transformers")  # test_hf, whose checkpoint builder this reuses, needs it
    from test_hf import NANOGPT_ARGS, nanogpt_forward, nanogpt_state_dict, write_nanogpt_ckpt

    from gptbook.tokenizer import CharTokenizer

    tok = CharTokenizer.train(Path(shakespeare_path).read_text(encoding="utf-8"))  # the 65 ids of shakespeare_char
    assert tok.vocab_size == NANOGPT_ARGS["vocab_size"]
    tok.save(tmp_path / "tok.json")
    sd = nanogpt_state_dict()
    ckpt = write_nanogpt_ckpt(tmp_path / "ckpt.pt", sd, NANOGPT_ARGS)
    idx = torch.tensor([tok.encode("ROMEO:")])
    with torch.no_grad():
        for _ in range(12):  # greedy decoding, nanoGPT's forward pass written out in test_hf
            idx = torch.cat([idx, nanogpt_forward(sd, NANOGPT_ARGS, idx)[:, -1].argmax(-1, keepdim=True)], dim=1)
    argv = ["sample", "--nanogpt", ckpt, "--tokenizer", tmp_path / "tok.json", "--prompt", "ROMEO:"]
    status, out, err = call(capsys, *argv, "--max-new-tokens", 12, "--temperature", 0)
    assert status == 0, err
    assert out == tok.decode(idx[0].tolist()) + "\n" and err == ""
    status, out, err = call(capsys, *argv, "--max-new-tokens", 30, "--seed", 1, "--num-samples", 2)
    assert status == 0 and out.startswith("ROMEO:") and out.count("ROMEO:") == 2, err


def _hf_folder(tmp_path, text: str) -> Path:
    "A tiny Hugging Face GPT-2 with a byte-level BPE tokenizer trained on `text`, saved as from_pretrained reads it."
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "hf"
    folder.mkdir()
    from tokenizers.pre_tokenizers import ByteLevel
    from tokenizers.trainers import BpeTrainer

    bpe = ByteLevelBPETokenizer()
    trainer = BpeTrainer(vocab_size=300, min_frequency=1, show_progress=False, initial_alphabet=ByteLevel.alphabet())
    bpe._tokenizer.train_from_iterator([text], trainer=trainer)  # all 256 byte tokens, as GPT-2's vocabulary has
    bpe.save(str(folder / "tokenizer.json"))  # the tokenizers library's own file, as the hub holds it
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=32, n_embd=32, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(folder, safe_serialization=True)
    return folder


def test_sample_hf_folder(capsys, tmp_path, shakespeare_path):
    folder = _hf_folder(tmp_path, Path(shakespeare_path).read_text(encoding="utf-8")[:5000])
    status, out, err = call(capsys, "sample", "--hf", folder, "--prompt", "ROMEO:", "--max-new-tokens", 5)
    assert status == 0, err
    assert out.startswith("ROMEO:")


def test_train_init_from_a_run(capsys, run_dir, shakespeare_path, tmp_path):
    "A fine-tuning run starts from the run's weights (its first val loss is the run's last) on other text."
    text = tmp_path / "t.txt"
    text.write_text(Path(shakespeare_path).read_text(encoding="utf-8")[:20000], encoding="utf-8")
    argv = ["--data", text, "--max-iters", 4, "--eval-interval", 2, "--sample-tokens", 0, "--eval-iters", 2]
    argv += ["--no-progress"]
    status, out, err = call(capsys, "train", "--out", tmp_path / "ft", "--init-from", run_dir[0], *argv)
    assert status == 0, err
    assert f"initialized from {run_dir[0]}" in out
    base = load_checkpoint(run_dir[0])
    tuned = load_checkpoint(tmp_path / "ft")
    assert tuned.model.config == base.model.config and tuned.tokenizer.vocab_size == base.tokenizer.vocab_size
    status, _, err = call(capsys, "train", "--out", tmp_path / "ft1", "--init-from", run_dir[0], *argv, "--lr", 1e-12)
    assert status == 0, err  # a step of lr 1e-12: the weights are the run's
    tuned = load_checkpoint(tmp_path / "ft1").model.state_dict()
    for name, w in base.model.state_dict().items():
        torch.testing.assert_close(tuned[name], w, atol=1e-8, rtol=0)
    status, _, err = call(capsys, "train", "--out", tmp_path / "ft2", "--init-from", run_dir[0], "--n-layers", 2)
    assert status == 1 and "n_layers" in err and "--n-layers" in err and len(err.strip().splitlines()) == 1
    status, _, err = call(capsys, "train", "--out", tmp_path / "ft", "--resume", "--init-from", run_dir[0])
    assert status == 1 and "--init-from" in err
    status, _, err = call(capsys, "train", "--out", tmp_path / "ft3", "--init-from", tmp_path / "nothing")
    assert status == 1 and "neither" in err


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--tokenizer", "bpe"], "--tokenizer"),
        (["--tokenizer", "char"], "--tokenizer"),  # even the default: the weights decide, not the flag
        (["--preset", "gpt2-small"], "--preset"),
        (["--bpe-vocab-size", "512"], "--bpe-vocab-size"),
        (["--tokenizer", "bpe", "--preset", "baby"], "--preset, --tokenizer"),
    ],
)
def test_train_init_from_refuses_what_the_weights_fix(capsys, tmp_path, flags, named):
    "A flag that would choose the model or tokenizer is one line naming it, before anything is read or written."
    status, out, err = call(capsys, "train", "--out", tmp_path / "ft", "--init-from", tmp_path / "nothing", *flags)
    assert status == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"fixes the model and its tokenizer: drop {named}" in err
    assert not (tmp_path / "ft").exists()
    config = tmp_path / "config.json"  # the same through a replayed config that names --init-from
    config.write_text(json.dumps({"train_config": {"init_from": str(tmp_path / "nothing")}}), encoding="utf-8")
    status, _, err = call(capsys, "train", "--config", config, "--out", tmp_path / "ft", *flags)
    assert status == 1 and f"drop {named}" in err, err


def test_train_init_from_hf_folder(capsys, tmp_path, shakespeare_path):
    text = Path(shakespeare_path).read_text(encoding="utf-8")[:5000]
    folder = _hf_folder(tmp_path, text)
    data = tmp_path / "t.txt"
    data.write_text(text, encoding="utf-8")
    argv = ["--data", data, "--max-iters", 2, "--eval-interval", 1, "--eval-iters", 1, "--batch-size", 2]
    argv += ["--sample-tokens", 0]
    status, out, err = call(capsys, "train", "--out", tmp_path / "ft", "--init-from", folder, *argv)
    assert status == 0, err
    assert load_checkpoint(tmp_path / "ft").model.config.n_layers == 1


def test_ctrl_c_names_the_checkpoint_and_the_resume_command(capsys, tmp_path, monkeypatch, shakespeare_path):
    from gptbook.train import Trainer

    step = Trainer.train_step

    def interrupted(self):
        if self.step == 3:
            raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    out = tmp_path / "run"
    status, _, err = call(capsys, "train", "--out", out, *TINY, "--max-iters", 10, "--eval-interval", 2)
    assert status == 130
    assert f"the last checkpoint is {out / 'ckpt_0000002'}" in err
    assert f"gptbook train --out {out} --resume" in err


# ------------------------------------------------------------------ a CLI without traps (issue 26, F10-F14)


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["train", "--max-iter", "5"],
            "gptbook train: error: unrecognized arguments: --max-iter 5; did you mean --max-iters?",
        ),
        (
            ["train", "--max-itrs", "5"],
            "gptbook train: error: unrecognized arguments: --max-itrs 5; did you mean --max-iters?",
        ),
        (
            ["sample", "--promt", "x"],
            "gptbook sample: error: unrecognized arguments: --promt; did you mean --prompt?",
        ),
        (
            ["eval", "--data", "f", "--batch=2"],
            "gptbook eval: error: unrecognized arguments: --batch=2; did you mean --batch-size?",
        ),
        (
            ["tokenizer", "train", "f", "--out", "o", "--vocab-siz=9"],
            "gptbook tokenizer train: error: unrecognized arguments: --vocab-siz=9; did you mean --vocab-size?",
        ),
        (["--verison"], "gptbook: error: unrecognized arguments: --verison; did you mean --version?"),
    ],
)
def test_no_prefixes_and_unknown_flags_are_the_subcommands_error(capsys, tmp_path, monkeypatch, argv, said):
    "F10: a prefix is not a flag, and an unknown flag is named by the command given it, with its help and a guess."
    monkeypatch.chdir(tmp_path)  # where a prefix taken for its flag would train
    status, out, err = call(capsys, *argv)
    prog = said.partition(": error")[0]
    assert status == 2 and out == "" and err.strip() == f"{said} (see `{prog} --help`)"


def test_a_flag_of_several_values_never_swallows_the_run(capsys, run_dir):
    "F10: `--stop-strings xyz RUN` keeps RUN; the flag takes one value a use and repeats."
    base = ["--max-new-tokens", 30, "--seed", 3, "--prompt", "KING"]
    s1, before, _ = call(capsys, "sample", "--stop-strings", "xyz", "--stop-strings", "e", run_dir[0], *base)
    s2, after, _ = call(capsys, "sample", run_dir[0], *base, "--stop-strings", "xyz", "--stop-strings", "e")
    assert s1 == s2 == 0 and before == after
    s3, whole, _ = call(capsys, "sample", run_dir[0], *base)
    assert s3 == 0 and whole.startswith(before.rstrip("\n")) and "e" not in before[len("KING") :]


def test_device_reads_the_same_in_every_command(capsys):
    "F10: one metavar for --device in train, sample and eval."
    for command in ("train", "sample", "eval"):
        status, out, _ = call(capsys, command, "--help")
        assert status == 0 and "--device DEVICE" in out and "--device TEXT" not in out, command


@pytest.mark.parametrize(
    "flags, lead",
    [
        (["--n-heads", "3"], "--n-heads, --d-model: d_model=128 is not divisible by n_heads=3"),
        (["--d-model", "130"], "--d-model: d_model=130 is not divisible by n_heads=4"),
        (["--d-model", "130", "--n-heads", "3"], "--d-model: d_model=130 is not divisible by n_heads=3"),
    ],
)
def test_a_rule_of_two_fields_blames_the_flag_given_first(capsys, tmp_path, flags, lead):
    "F14: `--n-heads 3` on the baby's d_model 128 is the user's --n-heads, named first, with --d-model."
    status, _, err = call(capsys, "train", "--out", tmp_path / "run", *flags)
    assert status == 1 and err.startswith(f"gptbook train: error: {lead}"), err
    assert not (tmp_path / "run").exists()


def test_an_unknown_character_gets_the_cli_s_fix(capsys, run_dir):
    "F12: a character the char run never saw suggests a BPE run (`--tokenizer bpe`), not an API call."
    status, _, err = call(capsys, "sample", run_dir[0], "--prompt", "Café")
    assert status == 1 and "'é' at position 3" in err and "gptbook train --tokenizer bpe" in err
    assert "CharTokenizer.train" not in err and len(err.strip().splitlines()) == 1


def test_offline_without_the_data_leads_with_the_cli_s_ways(capsys, tmp_path, monkeypatch):
    "F12: no file, no network: GPTBOOK_DATA and --data come before the Python call."
    import urllib.request

    monkeypatch.delenv("GPTBOOK_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    status, _, err = call(capsys, "train", "--out", tmp_path / "run")
    assert status == 1 and "Supply the file in one of these ways: set GPTBOOK_DATA=" in err
    assert err.index("gptbook train --data") < err.index("tiny_shakespeare(path=")


def test_tokenizer_train_char_and_special_tokens(capsys, tmp_path, shakespeare):
    "`--char` writes nanoGPT's shakespeare_char tokenizer; `--special` adds special tokens; contradictions refused."
    from gptbook.tokenizer import load_tokenizer

    text = tmp_path / "input.txt"
    text.write_text(shakespeare, encoding="utf-8")
    assert call(capsys, "tokenizer", "train", text, "--char", "--out", tmp_path / "c.json")[0] == 0
    assert load_tokenizer(tmp_path / "c.json").chars == sorted(set(shakespeare))  # nanoGPT's prepare.py
    argv = ["tokenizer", "train", text, "--out", tmp_path / "b.json", "--vocab-size", 260]
    assert call(capsys, *argv, "--special", "<|endoftext|>", "--special", "<|pad|>")[0] == 0
    assert load_tokenizer(tmp_path / "b.json").special_tokens == {"<|endoftext|>": 258, "<|pad|>": 259}
    for bad in (["--char", "--vocab-size", "300"], ["--char", "--no-pattern"], ["--char", "--special", "<s>"], []):
        status, _, err = call(capsys, "tokenizer", "train", text, "--out", tmp_path / "x.json", *bad)
        assert status == 1 and "give --vocab-size N for a BPE" in err and not (tmp_path / "x.json").exists(), err


def test_train_on_a_tokenizer_file_keeps_its_special_tokens(capsys, tmp_path, shakespeare):
    "F8: the file `gptbook tokenizer train` writes trains a run, and the run's checkpoint holds it, specials and all."
    from gptbook.tokenizer import load_tokenizer

    text = tmp_path / "t.txt"
    text.write_text(shakespeare[:20_000], encoding="utf-8")
    argv = [
        "tokenizer",
        "train",
        text,
        "--vocab-size",
        300,
        "--special",
        "<|endoftext|>",
        "--out",
        tmp_path / "tok.json",
    ]
    assert call(capsys, *argv)[0] == 0
    flags = ["--data", text, "--max-iters", 2, "--eval-interval", 2, "--sample-tokens", 5, *TINY]
    status, out, err = call(capsys, "train", "--out", tmp_path / "run", "--tokenizer", tmp_path / "tok.json", *flags)
    assert status == 0, err
    tok, saved = load_tokenizer(tmp_path / "tok.json"), load_checkpoint(tmp_path / "run").tokenizer
    assert (saved.merges, saved.pattern, saved.special_tokens) == (tok.merges, tok.pattern, {"<|endoftext|>": 299})
    assert load_checkpoint(tmp_path / "run").model.config.vocab_size == 300
    status, out, err = call(
        capsys, "train", "--out", tmp_path / "run", "--resume", "--max-iters", 3, "--sample-tokens", 0
    )
    assert status == 0 and load_checkpoint(tmp_path / "run").tokenizer.special_tokens == tok.special_tokens, err


def test_bpe_runs_split_with_gpt2s_pattern(capsys, tmp_path, shakespeare):
    "F7: the run's BPE is the one `gptbook tokenizer train` makes from the same training text."
    from gptbook.data import train_val_split
    from gptbook.tokenizer import GPT2_PATTERN, load_tokenizer

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    try:
        (tmp_path / "t.txt").write_text(shakespeare[:20_000], encoding="utf-8")
        (tmp_path / "train.txt").write_text(train_val_split(shakespeare[:20_000])[0], encoding="utf-8")
        flags = ["--max-iters", 1, "--eval-interval", 1, "--sample-tokens", 0, *TINY, "--bpe-vocab-size", 300]
        status, _, err = call(
            capsys, "train", "--out", tmp_path / "run", "--data", tmp_path / "t.txt", "--tokenizer", "bpe", *flags
        )
        assert status == 0, err
        argv = ["tokenizer", "train", tmp_path / "train.txt", "--vocab-size", 300, "--out", tmp_path / "tok.json"]
        assert call(capsys, *argv)[0] == 0
    finally:
        monkeypatch.undo()
    run_tok = load_checkpoint(tmp_path / "run").tokenizer
    assert run_tok.pattern == GPT2_PATTERN and run_tok.merges == load_tokenizer(tmp_path / "tok.json").merges


def test_a_vocabulary_past_65536_ids_trains_samples_and_scores(capsys, tmp_path):
    "F15: 100,000 ids (cl100k_base's scale, made cheaply of characters) train on uint32 ids, then sample and eval."
    import numpy as np

    from gptbook.tokenizer import CharTokenizer

    chars = [chr(0x10000 + i) for i in range(100_000)]
    CharTokenizer(chars).save(tmp_path / "wide.json")
    ids = np.random.default_rng(0).integers(0, 100_000, 2_000)
    (tmp_path / "wide.txt").write_text("".join(chars[i] for i in ids), encoding="utf-8")
    flags = ["--data", tmp_path / "wide.txt", "--max-iters", 2, "--eval-interval", 2, "--sample-tokens", 0, *TINY]
    status, out, err = call(capsys, "train", "--out", tmp_path / "run", "--tokenizer", tmp_path / "wide.json", *flags)
    assert status == 0 and "(2,000 tokens: 1,800 train, 200 val)" in out, err
    assert load_checkpoint(tmp_path / "run").model.config.vocab_size == 100_000
    status, out, err = call(capsys, "sample", tmp_path / "run", "--prompt", chars[99_999], "--max-new-tokens", 3)
    assert status == 0 and out.startswith(chars[99_999]) and len(out.strip()) == 4, err
    status, out, err = call(capsys, "eval", tmp_path / "run", "--data", tmp_path / "wide.txt")
    assert status == 0 and "2,000 tokens" in out, err


def test_eval_scores_hugging_face_and_nanogpt_models(capsys, run_dir, tmp_path, shakespeare):
    "Review 3d: `gptbook eval --hf FOLDER` and `--nanogpt CKPT` score the run's own model exactly as the run does."
    pytest.importorskip("transformers")
    from test_hf import write_nanogpt_ckpt

    from gptbook.hf import nanogpt_key, save_hf

    ck = load_checkpoint(run_dir[0])
    save_hf(ck.model, tmp_path / "hf")
    c = ck.model.config
    state = {nanogpt_key(k): v for k, v in ck.model.state_dict().items()}
    args = dict(n_layer=c.n_layers, n_head=c.n_heads, n_embd=c.d_model, block_size=c.max_seq_len, bias=c.bias)
    write_nanogpt_ckpt(tmp_path / "ckpt.pt", state, args | dict(vocab_size=c.vocab_size, dropout=0.0), masks=False)
    (tmp_path / "t.txt").write_text(shakespeare[-3000:], encoding="utf-8")
    tok = ["--tokenizer", ck.path / "tokenizer.json"]
    scores = [
        call(capsys, "eval", *source, "--data", tmp_path / "t.txt")
        for source in ([run_dir[0]], ["--hf", tmp_path / "hf", *tok], ["--nanogpt", tmp_path / "ckpt.pt", *tok])
    ]
    assert [s[0] for s in scores] == [0, 0, 0], [s[2] for s in scores]
    run, hf, nano = (s[1].splitlines()[-1] for s in scores)
    assert run == hf and run.startswith("loss ") and nano.startswith("loss ")
    loss = lambda line: float(line.split()[1])  # noqa: E731
    assert abs(loss(nano) - loss(run)) < 1e-3  # nanoGPT's exact GELU against the run's tanh approximation


def test_sample_hf_hub_name_reads_the_tokenizer_from_the_snapshot(tmp_path, shakespeare):
    "F2: `gptbook sample --hf gpt2` takes the model and the tokenizer from one snapshot (a fake hub cache, offline)."
    pytest.importorskip("huggingface_hub")
    folder = _hf_folder(tmp_path, shakespeare[:5000])
    snap = tmp_path / "hf_home" / "hub" / "models--gpt2" / "snapshots" / ("0123456789abcdef" * 3)[:40]
    snap.parent.mkdir(parents=True)
    shutil.copytree(folder, snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text(snap.name)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    argv = ["--prompt", "ROMEO:", "--max-new-tokens", 5, "--seed", 1]
    by_name = subprocess.run(
        [sys.executable, "-m", "gptbook", "sample", "--hf", "gpt2", *map(str, argv)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert by_name.returncode == 0, by_name.stderr
    by_folder = run_cli("sample", "--hf", folder, *argv)
    assert by_name.stdout == by_folder.stdout and by_name.stdout.startswith("ROMEO:")
