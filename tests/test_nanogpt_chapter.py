"Chapter 11 (Reading nanoGPT): its permalinks point at the nanoGPT lines they name; its recorded checkpoint run holds."

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "nbs" / "11_nanogpt.ipynb"
RESULTS = ROOT / "bench" / "results" / "nanogpt_checkpoint.json"
CLONE = Path(os.environ.get("NANOGPT_DIR", "/work/.mirror/karpathy+nanoGPT/repo"))  # absent: the line checks skip
COMMIT = "3adf61e154c3fe3fca428ad6bc3818b27a3b8291"
BASE = f"https://github.com/karpathy/nanoGPT/blob/{COMMIT}/"
PERMALINK = re.compile(re.escape(BASE) + r"([\w/]+\.(?:py|md))#L(\d+)(?:-L(\d+))?")

# each link of the chapter: (file, text of its first line, text of its last line); the line numbers are computed
NANOGPT_LINES = {
    "block_size": ("model.py", "block_size: int = 1024", None),
    "n_layer": ("model.py", "n_layer: int = 12", "n_embd: int = 768"),
    "vocab_size": ("model.py", "vocab_size: int = 50304", None),
    "bias_model": ("model.py", "bias: bool = True", None),
    "bias_train": ("train.py", "bias = False", None),
    "wte": ("model.py", "wte = nn.Embedding", "wpe = nn.Embedding"),
    "h": ("model.py", "h = nn.ModuleList", None),
    "ln_f": ("model.py", "ln_f = LayerNorm", "self.lm_head = nn.Linear"),
    "attention": ("model.py", "class CausalSelfAttention", "self.c_proj = nn.Linear(config.n_embd, config.n_embd"),
    "mlp": ("model.py", "class MLP", "return x\n\nclass Block"),
    "block": ("model.py", "class Block", "x = x + self.mlp"),
    "gelu": ("model.py", "self.gelu    = nn.GELU()", None),
    "last_position": ("model.py", "if targets is not None:", "logits = self.lm_head(x[:, [-1], :])"),
    "generate": ("model.py", "def generate(", "idx = torch.cat((idx, idx_next), dim=1)"),
    "wpe": ("model.py", "wpe = nn.Embedding", None),
    "layernorm": ("model.py", "class LayerNorm", "return F.layer_norm"),
    "split_heads": ("model.py", "q, k, v  = self.c_attn(x).split", "v = v.view(B, T"),
    "flash": ("model.py", "# flash attention make GPU go brrrrr", "y = torch.nn.functional.scaled_dot_product"),
    "decay": ("model.py", "# create optim groups", "nodecay_params = [p"),
    "scaler": ("train.py", "# initialize a GradScaler", "scaler = torch.cuda.amp.GradScaler"),
    "eval_batches": ("train.py", "def estimate_loss():", "out[split] = losses.mean()"),
    "get_batch": ("train.py", "ix = torch.randint(len(data) - block_size", None),
    "seed": ("train.py", "torch.manual_seed(1337 + seed_offset)", None),
    "checkpoint": ("train.py", "checkpoint = {", "torch.save(checkpoint"),
    "configurator": ("train.py", "exec(open('configurator.py').read())", None),
    "from_pretrained": ("model.py", "def from_pretrained(", "return model\n\n    def configure_optimizers"),
    "device": ("train.py", "device = 'cuda' # examples", None),
    "ddp_cuda": ("train.py", "init_process_group(backend=backend)", "device = f'cuda:{ddp_local_rank}'"),
    "tying": ("model.py", "self.transformer.wte.weight = self.lm_head.weight", None),
    "init": ("model.py", "# init all weights", "std=0.02/math.sqrt(2 * config.n_layer))"),
    "get_lr": ("train.py", "def get_lr(it):", "return learning_rate * (it + 1) / (warmup_iters + 1)"),
    "lr_decay_iters": ("train.py", "# 2) if it > lr_decay_iters", "coeff = 0.5 * (1.0 + math.cos"),
    "beta2_char": ("config/train_shakespeare_char.py", "beta2 = 0.99", None),
    "readme_teeth": ("README.md", "prioritizes teeth over education", None),
    "readme_compile": ("README.md", "~250ms / iter to 135ms / iter", None),
    "readme_cpu": ("README.md", "python train.py config/train_shakespeare_char.py --device=cpu", None),
}


def nanogpt_file(name: str) -> str:
    git = ["git", "--git-dir", str(CLONE), "show", f"{COMMIT}:{name}"]
    return subprocess.run(git, capture_output=True, text=True, check=True).stdout


def line_of(text: str, snippet: str, after: int = 0) -> int:
    "The 1-based line on which `snippet` begins, searching from line `after` + 1."
    offset = text.index(snippet, sum(len(x) for x in text.splitlines(keepends=True)[:after]))
    return text[:offset].count("\n") + 1


def permalink(key: str, files: dict) -> str:
    "The permalink of NANOGPT_LINES[key], its line numbers found in the clone."
    name, first, last = NANOGPT_LINES[key]
    start = line_of(files[name], first)  # a snippet in the middle of a line finds that line
    end = line_of(files[name], last, after=start - 1) if last else start
    return f"{BASE}{name}#L{start}" + (f"-L{end}" if end != start else "")


def chapter_text() -> str:
    nb = json.loads(CHAPTER.read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_every_permalink_is_at_the_commit_read():
    links = PERMALINK.findall(chapter_text())
    assert len(links) >= 25, f"the chapter should link each compared nanoGPT line; found {len(links)}"
    assert "github.com/karpathy/nanoGPT/blob/" not in PERMALINK.sub("", chapter_text())  # none at another commit


@pytest.mark.skipif(not CLONE.exists(), reason="needs the nanoGPT clone at /work/.mirror")
def test_permalinks_point_at_the_lines_they_describe():
    files = {name: nanogpt_file(name) for name, _, _ in NANOGPT_LINES.values()}
    expected = {permalink(key, files) for key in NANOGPT_LINES}
    found = {m.group(0) for m in PERMALINK.finditer(chapter_text())}
    assert found == expected, f"missing {sorted(expected - found)}; unknown {sorted(found - expected)}"


def test_recorded_checkpoint_run_holds():
    res = json.loads(RESULTS.read_text())
    assert res["nanogpt_commit"] == COMMIT  # the commit the chapter's links point at
    assert res["logits"]["max_abs_diff"] < 1e-5
    assert res["logits"]["max_abs_diff_gelu_tanh"] > 10 * res["logits"]["max_abs_diff"]  # the check can see a change
    g = res["greedy"]
    assert g["gptbook"] == g["nanogpt_generate_top_k_1"] == g["nanogpt_sample_py"]
    assert g["gptbook"].startswith(g["prompt"])
    assert res["checkpoint"]["best_val_loss"] == min(e["val_loss"] for e in res["training"]["evals"])
    assert res["checkpoint"]["model_args"]["bias"] is False  # train.py's default, which gptbook must honour
