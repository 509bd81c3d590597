"""gptbook.weights and gptbook.hf against `transformers` (a dev dependency): random tiny GPT-2 and Llama models saved
with save_pretrained, loaded with GPT.from_hf, equal logits; save_hf folders that transformers loads with equal logits;
hub names through a faked snapshot_download (nothing touches the network); nanoGPT checkpoints read with
weights_only; and one clear line for every file that does not fit, hostile ones included."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gptbook

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import gptbook.config  # noqa: E402
from gptbook.data import load_token_data  # noqa: E402
from gptbook.hf import from_nanogpt, hf_pretrained, load_hf, nanogpt_key, save_hf  # noqa: E402
from gptbook.weights import clean_state_dict, config_from_hf, hf_folder, load_nanogpt  # noqa: E402
from gptbook.model import GPT, GPTConfig  # noqa: E402
from gptbook.tokenizer import GPT2_PATTERN, BPETokenizer, CharTokenizer  # noqa: E402
from gptbook.train import TrainConfig, train  # noqa: E402

transformers.logging.set_verbosity_error()
ROOT = Path(__file__).resolve().parents[1]
ATOL = 1e-5  # float32 on both sides; measured differences are ~1e-6


def save(model, path, **kw):
    model.eval().save_pretrained(path, **kw)
    return path


def assert_same_logits(hf_model, ours, vocab_size, T):
    torch.manual_seed(1)
    idx = torch.randint(0, vocab_size, (3, T))
    with torch.no_grad():
        ref, got = hf_model(idx).logits, ours(idx)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=0, atol=ATOL)
    return (got - ref).abs().max().item()


def tiny_gpt2(**kw):
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=101, n_positions=24, n_embd=32, n_layer=3, n_head=4, **kw)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # HF starts norm gains at 1 and every bias at 0: randomize them so that a swapped
        for n, p in model.named_parameters():  # ln_1/ln_2 or a dropped bias changes the logits
            if "ln_" in n and n.endswith("weight"):
                p.normal_(1.0, 0.3)
            elif n.endswith("bias"):
                p.normal_(0.0, 0.1)
    return model


def tiny_llama(tie, n_kv_heads=2, **kw):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=101,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=32,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-5,
        **kw,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # HF initializes norm gains to one: randomize them so a mix-up cannot hide
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(1.0, 0.3)
    return model


@pytest.mark.parametrize("activation", ["gelu_new", "gelu"])
def test_gpt2_logits_match(tmp_path, activation):
    hf = tiny_gpt2(activation_function=activation)
    ours = GPT.from_hf(save(hf, tmp_path))
    c = ours.config
    assert (c.n_layers, c.n_heads, c.d_model, c.max_seq_len, c.positions, c.tie_weights) == (
        3,
        4,
        32,
        24,
        "learned",
        True,
    )
    assert c.ffn == ("gelu_tanh" if activation == "gelu_new" else "gelu")
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())
    assert_same_logits(hf, ours, 101, 24)


def test_gpt2_untied(tmp_path):
    hf = tiny_gpt2(tie_word_embeddings=False)
    with torch.no_grad():
        hf.lm_head.weight.normal_()
    ours = GPT.from_hf(save(hf, tmp_path))
    assert not ours.config.tie_weights
    assert_same_logits(hf, ours, 101, 24)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("n_kv_heads", [2, 6])
def test_llama_logits_match(tmp_path, tie, n_kv_heads):
    hf = tiny_llama(tie, n_kv_heads, rope_theta=50000.0)
    ours = GPT.from_hf(save(hf, tmp_path))
    c = ours.config
    assert (c.norm, c.positions, c.ffn, c.bias, c.tie_weights, c.resolved_kv_heads, c.d_ff) == (
        "rmsnorm",
        "rope",
        "swiglu",
        False,
        tie,
        n_kv_heads,
        96,
    )
    assert c.rope_base == 50000.0 and c.norm_eps == 1e-5
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())
    assert_same_logits(hf, ours, 101, 32)


def test_llama_with_biases(tmp_path):
    hf = tiny_llama(False, attention_bias=True, mlp_bias=True)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.5)
    ours = GPT.from_hf(save(hf, tmp_path))
    assert ours.config.bias
    assert_same_logits(hf, ours, 101, 32)


def test_sharded_checkpoint(tmp_path):
    hf = tiny_llama(False)
    save(hf, tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    assert_same_logits(hf, GPT.from_hf(tmp_path), 101, 32)


def test_rope_pairing_matters(tmp_path):
    "Without the split-halves -> interleaved permutation the logits differ: the permutation is what makes them equal."
    hf = tiny_llama(False)
    save(hf, tmp_path)
    config, sd = load_hf(tmp_path)
    ours = GPT(config)
    ours.load_state_dict(sd)
    ours.eval()
    unpermuted = dict(sd)
    for i in range(config.n_layers):
        q, k, v = (
            hf.model.layers[i].self_attn.q_proj.weight,
            hf.model.layers[i].self_attn.k_proj.weight,
            hf.model.layers[i].self_attn.v_proj.weight,
        )
        unpermuted[f"blocks.{i}.attn.c_attn.weight"] = torch.cat([q, k, v]).detach()
    wrong = GPT(config)
    wrong.load_state_dict(unpermuted)
    wrong.eval()
    idx = torch.randint(0, 101, (1, 32))
    with torch.no_grad():
        assert (wrong(idx) - hf(idx).logits).abs().max() > 1e-3
        torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=0, atol=ATOL)


def test_from_hf_dtype(tmp_path):
    hf = tiny_gpt2()
    ours = GPT.from_hf(save(hf, tmp_path), dtype=torch.bfloat16)
    assert ours.wte.weight.dtype == torch.bfloat16 and not ours.training


# ---------------------------------------------------------------------------------------------- errors


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_unknown_architecture(tmp_path):
    save(tiny_gpt2(), tmp_path)
    edit_config(tmp_path, architectures=["BertForMaskedLM"], model_type="bert")
    with pytest.raises(ValueError, match="unsupported architecture 'BertForMaskedLM'"):
        GPT.from_hf(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    save(tiny_llama(False), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.self_attn\.k_proj\.weight'.*missing"):
        GPT.from_hf(tmp_path)


def test_misshaped_tensor_is_named(tmp_path):
    save(tiny_gpt2(), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["transformer.h.2.mlp.c_fc.weight"] = tensors["transformer.h.2.mlp.c_fc.weight"].t().contiguous()
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"'transformer\.h\.2\.mlp\.c_fc\.weight' has shape \(128, 32\)"):
        GPT.from_hf(tmp_path)


def test_extra_tensors_are_an_error(tmp_path):
    save(tiny_gpt2(), tmp_path)
    edit_config(tmp_path, n_layer=2)
    with pytest.raises(ValueError, match="transformer.h.2"):
        GPT.from_hf(tmp_path)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPT.from_hf(tmp_path)
    save(tiny_gpt2(), tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin files are not read"):
        GPT.from_hf(tmp_path)


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(activation_function="relu"), "activation_function='relu'"),
        (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    ],
)
def test_unsupported_gpt2_options(changes, message):
    cfg = tiny_gpt2().config.to_dict()
    cfg.update(changes)
    with pytest.raises(ValueError, match=message):
        config_from_hf(cfg)


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), "RoPE scaling"),
        (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "RoPE scaling"),
        (dict(head_dim=16), "head_dim=16"),
        (dict(attention_bias=True, mlp_bias=False), "attention_bias=True"),
    ],
)
def test_unsupported_llama_options(changes, message):
    cfg = tiny_llama(False).config.to_dict()
    cfg.update(changes)
    with pytest.raises(ValueError, match=message):
        config_from_hf(cfg)


def test_config_from_hf_older_llama_keys(monkeypatch):
    "Older transformers write rope_theta at the top level and no rope_parameters."
    monkeypatch.setattr(gptbook.config, "memory_bytes", lambda: 1 << 40)  # 27 GB of weights: say the machine has them
    cfg = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        tie_word_embeddings=False,
        hidden_act="silu",
    )
    c = config_from_hf(cfg)
    assert c == GPTConfig.llama_style(
        vocab_size=32000,
        max_seq_len=4096,
        n_layers=32,
        n_heads=32,
        d_model=4096,
        n_kv_heads=32,
        d_ff=11008,
        rope_base=10000.0,
        norm_eps=1e-5,
    )
    with torch.device("meta"):
        llama2_7b = GPT(c)
    assert llama2_7b.num_params() == 6_738_415_616  # Llama 2 7B's published parameter count


def test_clean_state_dict():
    m = GPT(GPTConfig(vocab_size=37, max_seq_len=16, n_layers=2, n_heads=4, d_model=16))
    compiled = torch.compile(m)  # nothing compiles before the first call
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    clean = clean_state_dict(compiled.state_dict())
    assert list(clean) == list(m.state_dict())
    ddp_like = {"module." + k: v for k, v in compiled.state_dict().items()}
    fresh = GPT(GPTConfig(vocab_size=37, max_seq_len=16, n_layers=2, n_heads=4, d_model=16))
    fresh.load_state_dict(clean_state_dict(ddp_like))
    assert torch.equal(fresh.wte.weight, m.wte.weight)
    assert clean_state_dict({"blocks.0.module.x": 1}) == {"blocks.0.module.x": 1}  # only prefixes are stripped


def test_the_reader_gpt_from_hf_imports_never_imports_the_model():
    "GPT.from_hf imports gptbook.weights, which imports no model (no circle); gptbook.hf names the same load_hf."
    code = (
        "import sys, gptbook.weights; assert 'gptbook.model' not in sys.modules, 'weights imports the model'\n"
        "import gptbook.model; assert 'gptbook.hf' not in sys.modules\n"
        "import gptbook.hf; assert gptbook.hf.load_hf is gptbook.weights.load_hf and 'load_hf' in gptbook.hf.__all__"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]


# --- save_hf: our models as folders that transformers loads --------------------------------------------------------


def randomized(config: GPTConfig, seed=0) -> GPT:
    "A GPT with every tensor random, norm gains and biases included, so that a swapped or dropped tensor shows."
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn_like(p))
    return model.eval()


def assert_transformers_agree(model: GPT, folder, arch: str):
    theirs = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(theirs).__name__ == arch
    assert sum(p.numel() for p in theirs.parameters()) == model.num_params()
    torch.manual_seed(1)
    idx = torch.randint(0, model.config.vocab_size, (2, model.config.max_seq_len))
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, model(idx), rtol=0, atol=ATOL)


SAVE_STYLES = {
    "gpt2": (dict(), "GPT2LMHeadModel"),
    "gpt2-untied-exact-gelu-dff": (dict(tie_weights=False, ffn="gelu", d_ff=48), "GPT2LMHeadModel"),
    "llama-gqa-untied": (dict(llama=True, n_kv_heads=2, tie_weights=False, rope_base=5e4), "LlamaForCausalLM"),
    "llama-tied-bias": (dict(llama=True, bias=True, tie_weights=True, norm_eps=1e-6), "LlamaForCausalLM"),
}


def small_config(vocab_size=101, llama=False, **kw) -> GPTConfig:
    shape = dict(vocab_size=vocab_size, n_layers=2, n_heads=4, d_model=32, max_seq_len=16)
    return GPTConfig.llama_style(**shape | kw) if llama else GPTConfig(**shape | kw)


@pytest.mark.parametrize("style", SAVE_STYLES)
def test_save_hf_logits_match(tmp_path, style):
    overrides, arch = SAVE_STYLES[style]
    model = randomized(small_config(**overrides))
    folder = save_hf(torch.compile(model), tmp_path / "hf")  # a compiled model saves the model it wraps
    saved = ["README.md", "config.json", "generation_config.json", "model.safetensors"]
    assert sorted(p.name for p in folder.iterdir()) == saved
    assert_transformers_agree(model, folder, arch)


@pytest.fixture
def chars(shakespeare):
    return load_token_data("char")


@pytest.mark.parametrize("llama", [False, True], ids=["gpt2", "llama"])
def test_trained_model_to_transformers(tmp_path, chars, llama):
    "gptbook.train.train for a few steps, then save_hf: transformers gives the trained model's logits."
    config = small_config(chars.vocab_size, llama=llama, **(dict(n_kv_heads=2) if llama else {}))
    cfg = TrainConfig(
        out_dir=str(tmp_path / "run"), max_iters=4, batch_size=4, eval_interval=2, eval_iters=1, warmup_iters=1,
        lr=3e-3, progress=False,
    )  # fmt: skip
    torch.manual_seed(0)
    trained = train(cfg, config, data=chars).model.eval()
    assert not torch.equal(trained.wte.weight, randomized(config).wte.weight)
    assert_transformers_agree(
        trained, save_hf(trained, tmp_path / "hf"), "LlamaForCausalLM" if llama else "GPT2LMHeadModel"
    )


def test_save_hf_tokenizer(tmp_path):
    text = "Héllo wörld, naïve café! 日本語 🙂 it's   spaced\n\ttabs " * 30
    tok = BPETokenizer.train(text, vocab_size=300, pattern=GPT2_PATTERN, special_tokens=["<|endoftext|>"])
    model = randomized(small_config(tok.vocab_size))
    folder = save_hf(model, tmp_path / "hf", tokenizer=tok)
    theirs = AutoTokenizer.from_pretrained(folder)
    awkward = "naïve  café 🙂<|endoftext|>日本 it's\n"
    ids = tok.encode(awkward, allowed_special="all")
    assert theirs.encode(awkward) == ids and theirs.decode(ids) == awkward
    assert theirs.eos_token == "<|endoftext|>" and theirs.model_max_length == 16
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == tok.special_tokens["<|endoftext|>"]
    assert_transformers_agree(model, folder, "GPT2LMHeadModel")


def test_save_hf_tokenizer_errors(tmp_path):
    model = randomized(small_config(65))
    with pytest.raises(TypeError, match="CharTokenizer cannot be saved"):
        save_hf(model, tmp_path / "a", tokenizer=CharTokenizer.train("abc"))
    big = BPETokenizer.train("abcabcabd" * 20, vocab_size=266)
    with pytest.raises(ValueError, match="more than the model's vocab_size=65"):
        save_hf(model, tmp_path / "a", tokenizer=big)
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(norm_position="post"), "norm_position='post' has no Hugging Face form"),
        (dict(positions="sinusoidal"), "positions='sinusoidal' has no Hugging Face form"),
        (dict(positions="none"), "positions='none'"),
        (dict(positions="rope"), "cannot express norm='layernorm': use norm='rmsnorm'"),
        (dict(positions="rope", norm="rmsnorm"), "cannot express ffn='gelu_tanh': use ffn='swiglu'"),
        (dict(norm="rmsnorm"), "GPT2LMHeadModel, which cannot express norm='rmsnorm'"),
        (dict(ffn="swiglu"), "cannot express ffn='swiglu'"),
        (dict(bias=False), "cannot express bias=False"),
        (dict(n_kv_heads=2), "cannot express n_kv_heads=2"),
    ],
)
def test_save_hf_refuses(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as e:
        save_hf(GPT(small_config(**overrides)), tmp_path / "hf")
    assert "\n" not in str(e.value) and not (tmp_path / "hf").exists()


def test_save_hf_refuses_scaled_embeddings(tmp_path):
    "embed_scale has no GPT-2 or Llama form; set on the object, as the field may not exist yet."
    for llama in (False, True):
        model, folder = GPT(small_config(llama=llama)), tmp_path / f"hf-{llama}"
        model.config.embed_scale = True
        with pytest.raises(ValueError, match=r"embed_scale=True \(token embeddings times sqrt\(d_model\)\)") as e:
            save_hf(model, folder)
        assert "\n" not in str(e.value) and not folder.exists()
        model.config.embed_scale = False
        save_hf(model, folder)  # the same model, unscaled, is saved
        assert (folder / "model.safetensors").is_file()


def test_save_hf_replaces_atomically(tmp_path):
    first, second = randomized(small_config(), seed=0), randomized(small_config(), seed=1)
    save_hf(first, tmp_path / "hf")
    with pytest.raises(TypeError):
        save_hf(second, tmp_path / "hf", tokenizer=object())  # fails while writing: the old folder stays whole
    assert torch.equal(GPT.from_hf(tmp_path / "hf").wte.weight, first.wte.weight)
    save_hf(second, tmp_path / "hf")
    assert torch.equal(GPT.from_hf(tmp_path / "hf").wte.weight, second.wte.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary folder left behind


def test_save_hf_refuses_a_folder_holding_other_files_and_removes_nothing(tmp_path):
    "save_hf once replaced whatever was at its path, a training run's checkpoints included."
    model = randomized(small_config())
    run = tmp_path / "run"
    (run / "ckpt_0000020").mkdir(parents=True)
    (run / "ckpt_0000020" / "model.safetensors").write_bytes(b"weights")
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "config.json").write_text("{}")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with pytest.raises(FileExistsError, match=r"holds 2 file\(s\) that are not a saved model's") as e:
        save_hf(model, run)
    assert str(run) in str(e.value) and "\n" not in str(e.value)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing removed, nothing written
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is a file, not a folder"):
        save_hf(model, tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert (save_hf(model, tmp_path / "empty") / "model.safetensors").is_file()  # an empty folder is fine
    save(tiny_gpt2(), tmp_path / "theirs")  # transformers' own files, generation_config.json among them
    save_hf(model, tmp_path / "theirs")  # an earlier save is replaced whole
    saved = ["README.md", "config.json", "generation_config.json", "model.safetensors"]
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == saved


def test_save_hf_refuses_nan_weights_and_what_is_not_a_gpt(tmp_path):
    model = randomized(small_config())
    with torch.no_grad():
        model.blocks[1].mlp.c_fc.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp\.c_fc\.weight holds NaN or infinite weights"):
        save_hf(model, tmp_path / "hf")
    with pytest.raises(TypeError, match="save_hf saves a gptbook GPT, got a Linear"):
        save_hf(torch.nn.Linear(2, 2), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


HF_ROUND_TRIPS = {
    "gpt2": tiny_gpt2,
    "gpt2-untied": lambda: tiny_gpt2(tie_word_embeddings=False),
    "llama-gqa-untied": lambda: tiny_llama(False, 2),
    "llama-tied": lambda: tiny_llama(True, 6),
    "llama-bias": lambda: tiny_llama(False, 3, attention_bias=True, mlp_bias=True),
}


@pytest.mark.parametrize("name", HF_ROUND_TRIPS)
def test_hf_folder_round_trip_identical(tmp_path, name):
    "transformers' save_pretrained -> load_hf (GPT.from_hf) -> save_hf: the same tensors, bit for bit, same config."
    save(HF_ROUND_TRIPS[name](), tmp_path / "theirs")
    again = save_hf(GPT.from_hf(tmp_path / "theirs"), tmp_path / "ours")
    theirs, ours = load_file(tmp_path / "theirs" / "model.safetensors"), load_file(again / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for key, tensor in theirs.items():
        assert torch.equal(ours[key], tensor), key
    original, saved = (json.loads((f / "config.json").read_text()) for f in (tmp_path / "theirs", again))
    assert config_from_hf(saved) == config_from_hf(original)


# --- hub names: a faked snapshot_download; nothing touches the network ---------------------------------------------


def test_hub_name_goes_through_snapshot_download(tmp_path, monkeypatch):
    import huggingface_hub

    hf = tiny_gpt2()
    save(hf, tmp_path / "snapshot")
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert_same_logits(hf, GPT.from_hf("someone/tiny-gpt2"), 101, 24)
    ((repo_id, patterns),) = calls
    assert repo_id == "someone/tiny-gpt2" and "config.json" in patterns and "*.safetensors" in patterns
    assert not any(p.endswith((".bin", ".pt", ".pth", "*")) and p != "*.safetensors" for p in patterns), patterns
    monkeypatch.chdir(tmp_path)  # a folder of that name here is read as a folder, and the hub is not asked
    assert hf_folder("snapshot") == Path("snapshot") and len(calls) == 1
    assert hf_folder(str(tmp_path / "absent")) == tmp_path / "absent"  # a path is never a repository name
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        load_hf(tmp_path / "absent")
    assert len(calls) == 1


def test_hub_name_without_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r'pip install "gptbook\[hf\]", or pass a local folder') as e:
        load_hf("openai-community/gpt2")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("offline", [False, True])
def test_the_offline_message_names_hf_hub_offline_only_when_it_is_set(monkeypatch, offline):
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(repo_id, allow_patterns):
        raise LocalEntryNotFoundError("cannot reach the hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    with pytest.raises(FileNotFoundError, match="not in the cache") as e:
        load_hf("someone/tiny-gpt2")
    assert ("unset HF_HUB_OFFLINE" in str(e.value)) == offline
    assert ("connect to the network" in str(e.value)) == (not offline)


def test_hub_name_offline_with_empty_cache(tmp_path):
    "HF_HUB_OFFLINE=1 and an empty HF_HOME: one line saying what to set (a fresh process: the hub reads it at import)."
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf_home"),
        "PYTHONPATH": str(Path(gptbook.__file__).parents[1]),
    }
    script = (
        "from gptbook.hf import load_hf\n"
        "try:\n    load_hf('openai-community/gpt2')\nexcept FileNotFoundError as e:\n    print(e)"
    )
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    message = result.stdout.strip()
    assert "\n" not in message and "'openai-community/gpt2' is not a folder here" in message
    assert "HF_HUB_OFFLINE" in message and "pass a local folder" in message
    assert not list((tmp_path / "hf_home").rglob("*.safetensors"))


# --- a clean export: bos/eos, generation_config.json, modes, model card; GPT.save_hf -------------------------------


@pytest.mark.parametrize("eot", [False, True], ids=["no-eot", "eot"])
def test_save_hf_folders_load_without_warnings(tmp_path, caplog, eot):
    "bos/eos are <|endoftext|>'s id or null (never transformers' default, GPT-2's 50256): no warning on load."
    specials = ["<|endoftext|>"] if eot else []
    tok = BPETokenizer.train("To be, or not to be, that is the question. " * 20, 270, GPT2_PATTERN, specials)
    model = randomized(small_config(tok.vocab_size))
    folder = save_hf(model, tmp_path / "hf", tokenizer=tok)
    transformers.logging.set_verbosity_warning()
    transformers.logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            AutoModelForCausalLM.from_pretrained(folder)
            generation = transformers.GenerationConfig.from_pretrained(folder)
    finally:
        transformers.logging.disable_propagation()
        transformers.logging.set_verbosity_error()
    assert not [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    eos = tok.special_tokens["<|endoftext|>"] if eot else None
    assert generation.eos_token_id == generation.bos_token_id == eos
    config = json.loads((folder / "config.json").read_text())
    assert config["bos_token_id"] == config["eos_token_id"] == eos


def test_save_hf_files_follow_the_umask(tmp_path):
    "safetensors writes its files 0600; the folder's files get what `open` gives under the umask."
    mask = os.umask(0o022)
    try:
        tok = BPETokenizer.train("abcabd" * 30, 258)
        folder = save_hf(randomized(small_config(tok.vocab_size)), tmp_path / "hf", tok)
    finally:
        os.umask(mask)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()}
    assert set(modes.values()) == {"0o644"} and "model.safetensors" in modes, modes


def test_model_card_says_how_the_model_was_trained(tmp_path, chars):
    from gptbook.checkpoint import load_checkpoint

    cfg = TrainConfig(
        out_dir=str(tmp_path / "run7"), max_iters=2, batch_size=2, eval_interval=2, eval_iters=1, warmup_iters=1,
        progress=False,
    )  # fmt: skip
    train(cfg, small_config(chars.vocab_size), data=chars)
    ck = load_checkpoint(tmp_path / "run7")
    card = (save_hf(ck.model, tmp_path / "hf", None, ck.state) / "README.md").read_text()
    assert "GPT2LMHeadModel" in card and f"{ck.model.num_params() / 1e6:.2f}M parameters" in card
    assert f"2 steps of the run `run7`, validation loss {ck.state['val_loss']:.4f}" in card
    assert "tokenizer: none saved; no <|endoftext|>, so bos/eos are null" in card and str(tmp_path) not in card
    plain = (save_hf(ck.model, tmp_path / "hf2") / "README.md").read_text()
    assert "training: not recorded" in plain


def test_gpt_save_hf_is_save_hf(tmp_path):
    "HF users' muscle memory: model.save_hf(folder) and GPT.from_hf(folder), the same files as save_hf's."
    model = randomized(small_config())
    a, b = save_hf(model, tmp_path / "a"), model.save_hf(tmp_path / "b")
    assert b == tmp_path / "b"
    for f in a.iterdir():
        assert f.read_bytes() == (b / f.name).read_bytes(), f.name
    assert torch.equal(GPT.from_hf(b).wte.weight, model.wte.weight)


@pytest.mark.parametrize("module,convert", [("tiktoken", "to_tiktoken"), ("tokenizers", "to_hf")])
def test_a_missing_optional_package_is_one_line_naming_the_extra(monkeypatch, tmp_path, module, convert):
    tok = BPETokenizer.train("abcabd" * 30, 258)
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    with pytest.raises(ImportError, match=rf'needs {module}: pip install "gptbook\[hf\]"$') as e:
        getattr(tok, convert)()
    assert "\n" not in str(e.value)
    if module == "tokenizers":  # save_hf with a tokenizer converts it, and writes nothing
        with pytest.raises(ImportError, match=r'pip install "gptbook\[hf\]"'):
            save_hf(randomized(small_config(tok.vocab_size)), tmp_path / "hf", tok)
        assert not (tmp_path / "hf").exists()


def test_hf_pretrained_looks_a_name_up_once(tmp_path, monkeypatch):
    "Model and tokenizer from one snapshot: one hub lookup; a tokenizer given instead is used as it is."
    import huggingface_hub

    text = "naïve café, it's 日本 🙂 " * 30
    tok = BPETokenizer.train(text, 300, GPT2_PATTERN)
    model = randomized(small_config(tok.vocab_size))
    save_hf(model, tmp_path / "snap", tok)
    calls = []
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo_id, allow_patterns: calls.append(repo_id) or str(tmp_path / "snap"),
    )
    ours, ours_tok = hf_pretrained("someone/tiny", dtype=torch.bfloat16)
    assert calls == ["someone/tiny"] and ours.wte.weight.dtype == torch.bfloat16
    assert ours_tok.encode(text) == tok.encode(text)
    torch.testing.assert_close(
        ours.float()(torch.tensor([tok.encode(text)[:16]])),
        model(torch.tensor([tok.encode(text)[:16]])),
        rtol=0,
        atol=0.1,
    )
    other = CharTokenizer.train("abc")
    assert hf_pretrained(tmp_path / "snap", tokenizer=other)[1] is other and len(calls) == 1


# --- GPT-2 by hub name, end to end, from a fake hub cache (HF_HOME, HF_HUB_OFFLINE=1: no network) ------------------

SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory, shakespeare_path):
    "An HF_HOME whose cache holds `gpt2` as huggingface_hub lays it out: a tiny random GPT-2 and a tokenizer.json."
    home = tmp_path_factory.mktemp("hf_home")
    repo = home / "hub" / "models--gpt2"
    snap = repo / "snapshots" / SNAPSHOT
    torch.manual_seed(0)
    save(GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=2)), snap)
    text = shakespeare_path.read_text(encoding="utf-8")[:20_000]
    BPETokenizer.train(text, 290, GPT2_PATTERN).to_hf().save(str(snap / "tokenizer.json"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SNAPSHOT)
    (home / "data.txt").write_text(text, encoding="utf-8")
    return home


def run_offline(home: Path, script: str, cwd: Path) -> str:
    env = os.environ | {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, cwd=cwd, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def test_gpt2_by_name_end_to_end(fake_hub, tmp_path):
    "GPT.from_hf('gpt2'), hf_pretrained('gpt2') and `gptbook train --init-from gpt2` read one snapshot of the cache."
    script = f"""
        import json
        import torch
        from gptbook.checkpoint import load_checkpoint
        from gptbook.cli import main
        from gptbook.hf import hf_pretrained
        from gptbook.model import GPT
        from gptbook.tokenizer import BPETokenizer

        snap = {str(fake_hub / "hub" / "models--gpt2" / "snapshots" / SNAPSHOT)!r}
        model, tok = hf_pretrained("gpt2")
        assert torch.equal(model.wte.weight, GPT.from_hf("gpt2").wte.weight)
        assert tok.encode("ROMEO: thou") == BPETokenizer.from_hf(snap).encode("ROMEO: thou")
        argv = ["train", "--init-from", "gpt2", "--out", "ft", "--data", {str(fake_hub / "data.txt")!r}]
        argv += ["--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1", "--sample-tokens", "0"]
        assert main(argv + ["--no-progress", "--batch-size", "2"]) == 0
        ck = load_checkpoint("ft")
        assert ck.iter == 2 and ck.tokenizer.encode("ROMEO: thou") == tok.encode("ROMEO: thou")
        assert ck.model.config == model.config
        print(json.load(open("ft/config.json"))["train_config"]["init_from"])
    """
    assert run_offline(fake_hub, script, tmp_path).strip().endswith(SNAPSHOT)


def test_gptbook_sample_hf_by_name(fake_hub, tmp_path):
    script = """
        from gptbook.cli import main
        assert main(["sample", "--hf", "gpt2", "--prompt", "ROMEO:", "--max-new-tokens", "5", "--seed", "0"]) == 0
    """
    assert run_offline(fake_hub, script, tmp_path).startswith("ROMEO:")


# --- nanoGPT checkpoints -------------------------------------------------------------------------------------------

from test_lab import NANOGPT_LAYER, NANOGPT_TOP  # noqa: E402  nanoGPT's own names and shapes, recorded from its model.py

NANOGPT_ARGS = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, bias=True, vocab_size=65, dropout=0.0)


def nanogpt_state_dict(bias=True, seed=0) -> dict:
    "Random tensors under nanoGPT's names and shapes (the config recorded in test_lab), the head tied to wte."
    torch.manual_seed(seed)
    names = NANOGPT_TOP | {f"transformer.h.{i}.{k}": s for i in range(4) for k, s in NANOGPT_LAYER.items()}
    sd = {}
    for name, shape in names.items():
        if name.endswith(".bias") and not bias:
            continue
        gain = name.endswith("weight") and len(shape) == 1
        sd[name] = (1.0 if gain else 0.0) + (0.3 if len(shape) == 1 else 0.05) * torch.randn(shape)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]  # nanoGPT ties them: one tensor under two names
    return sd


def nanogpt_forward(sd: dict, args: dict, idx: torch.Tensor) -> torch.Tensor:
    "nanoGPT's forward pass (model.py), written out with torch.nn.functional on its own tensor names."
    F = torch.nn.functional
    B, T = idx.shape
    C, nh = args["n_embd"], args["n_head"]
    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(args["n_layer"]):
        p = f"transformer.h.{i}."

        def ln(x, name, p=p):
            return F.layer_norm(x, (C,), sd[p + name + ".weight"], sd.get(p + name + ".bias"), 1e-5)

        def linear(x, name, p=p):
            return F.linear(x, sd[p + name + ".weight"], sd.get(p + name + ".bias"))

        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in linear(ln(x, "ln_1"), "attn.c_attn").split(C, 2))
        att = ((q @ k.transpose(-2, -1)) / (C // nh) ** 0.5).masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + linear((att @ v).transpose(1, 2).reshape(B, T, C), "attn.c_proj")
        x = x + linear(F.gelu(linear(ln(x, "ln_2"), "mlp.c_fc")), "mlp.c_proj")
    x = F.layer_norm(x, (C,), sd["transformer.ln_f.weight"], sd.get("transformer.ln_f.bias"), 1e-5)
    return F.linear(x, sd["lm_head.weight"])


def write_nanogpt_ckpt(path, sd, args, compiled=True, masks=True):
    "A ckpt.pt laid out as nanoGPT's train.py writes it."
    model = dict(sd)
    if masks:  # the causal-mask buffers of PyTorch without flash attention
        T = sd["transformer.wpe.weight"].shape[0]
        model |= {f"transformer.h.{i}.attn.bias": torch.tril(torch.ones(T, T)).view(1, 1, T, T) for i in range(4)}
    if compiled:
        model = {f"_orig_mod.{k}": v for k, v in model.items()}
    config = {"batch_size": 12, "learning_rate": 6e-4, "dataset": "shakespeare_char", "compile": compiled}
    optimizer = {"state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.zeros(3)}}, "param_groups": [{"lr": 6e-4}]}
    ckpt = {"model": model, "optimizer": optimizer, "model_args": args, "config": config}
    ckpt |= {"iter_num": 5, "best_val_loss": torch.tensor(1.5)}
    torch.save(ckpt, path)
    return path


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("compiled", [True, False])
def test_from_nanogpt_logits(tmp_path, bias, compiled):
    args = NANOGPT_ARGS | {"bias": bias}
    sd = nanogpt_state_dict(bias)
    model = from_nanogpt(write_nanogpt_ckpt(tmp_path / "ckpt.pt", sd, args, compiled=compiled))
    config, state_dict = load_nanogpt(tmp_path / "ckpt.pt")  # the reader from_nanogpt builds on: no model built
    assert config == model.config and state_dict.keys() == model.state_dict().keys()
    c = model.config
    assert (c.n_layers, c.n_heads, c.d_model, c.max_seq_len, c.vocab_size) == (4, 4, 128, 64, 65)
    assert (c.ffn, c.bias, c.tie_weights, c.positions, c.norm) == ("gelu", bias, True, "learned", "layernorm")
    assert not model.training and model.lm_head.weight is model.wte.weight
    idx = torch.randint(0, 65, (2, 64))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), nanogpt_forward(sd, args, idx), rtol=0, atol=ATOL)


def test_nanogpt_key_is_the_recorded_mapping():
    "The mapping from_nanogpt (and chapter 11) uses gives nanoGPT's recorded names and shapes, nothing left over."
    theirs = {nanogpt_key(k): tuple(v.shape) for k, v in GPT(GPTConfig.baby(65)).state_dict().items()}
    assert theirs == NANOGPT_TOP | {f"transformer.h.{i}.{k}": s for i in range(4) for k, s in NANOGPT_LAYER.items()}


class Trap:
    "Unpickling this object would create the marker file: code run by loading a file."

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_from_nanogpt_runs_no_pickled_code(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"model": {"x": Trap(marker)}, "model_args": NANOGPT_ARGS}, tmp_path / "ckpt.pt")
    assert not marker.exists()
    with pytest.raises(ValueError, match="none of its code ran") as e:
        from_nanogpt(tmp_path / "ckpt.pt")
    assert "\n" not in str(e.value)
    assert not marker.exists()


def test_from_nanogpt_errors(tmp_path):
    sd = nanogpt_state_dict()
    with pytest.raises(FileNotFoundError, match="ckpt.pt that nanoGPT's train.py writes"):
        from_nanogpt(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="cannot be read .*the file is damaged"):
        from_nanogpt(tmp_path / "junk.pt")
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="is not a nanoGPT checkpoint: it has no 'model' and 'model_args'"):
        from_nanogpt(tmp_path / "other.pt")
    no_size = {k: v for k, v in NANOGPT_ARGS.items() if k != "block_size"}
    with pytest.raises(ValueError, match="model_args has no 'block_size'"):
        from_nanogpt(write_nanogpt_ckpt(tmp_path / "a.pt", sd, no_size))
    with pytest.raises(
        ValueError, match=r"'transformer.wpe.weight' has shape \(64, 128\), but model_args implies \(32"
    ):
        from_nanogpt(write_nanogpt_ckpt(tmp_path / "b.pt", sd, NANOGPT_ARGS | {"block_size": 32}))
    with pytest.raises(ValueError, match="have no place in the model.*does model_args describe"):
        from_nanogpt(
            write_nanogpt_ckpt(tmp_path / "c.pt", sd | {"transformer.extra.weight": torch.zeros(2)}, NANOGPT_ARGS)
        )


def test_from_nanogpt_refuses_every_pickled_call_as_code_not_damage(tmp_path):
    "torch 2.13 words the refusal 'unsupported GLOBAL posix.system': reported as code that did not run, not as damage."
    import pickle

    marker = tmp_path / "pwned"

    class System:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model": {"x": System()}, "model_args": NANOGPT_ARGS}, tmp_path / "torchsave.pt")
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"model": System()}, protocol=4))
    for name in ("torchsave.pt", "plain.pkl"):
        with pytest.raises(ValueError, match=r"asks to call \w+\.system while loading") as e:
            from_nanogpt(tmp_path / name)
        assert "none of its code ran" in str(e.value) and "damaged" not in str(e.value)
    assert not marker.exists()


def _model_ints(sd):
    return {k: 1 for k in sd}


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p, sd: p.write_bytes(b""), r"is empty \(0 bytes\)"),
        (lambda p, sd: torch.save({"model": [1, 2], "model_args": NANOGPT_ARGS}, p), "'model' is a list, not a dict"),
        (lambda p, sd: torch.save({"model": _model_ints(sd), "model_args": NANOGPT_ARGS}, p), "is a int, not floating"),
        (lambda p, sd: torch.save({"model": sd, "model_args": [1, 2]}, p), "model_args"),
        (lambda p, sd: torch.save({"model": sd, "model_args": NANOGPT_ARGS | {"dropout": "x"}}, p), "dropout"),
        (
            lambda p, sd: torch.save(
                {"model": sd | {"transformer.wte.weight": torch.ones(65, 128).long()}, "model_args": NANOGPT_ARGS}, p
            ),
            "dtype torch.int64, not floating",
        ),  # fmt: skip
        (
            lambda p, sd: torch.save({"model": {k: v.bool() for k, v in sd.items()}, "model_args": NANOGPT_ARGS}, p),
            "dtype torch.bool",
        ),  # fmt: skip
        (
            lambda p, sd: torch.save(
                {"model": {k: v * float("nan") for k, v in sd.items()}, "model_args": NANOGPT_ARGS}, p
            ),
            "holds NaN or infinite weights",
        ),  # fmt: skip
    ],
    ids=["empty", "model_list", "model_ints", "args_list", "args_dropout", "int_weights", "bool_weights", "nan"],
)
def test_a_malformed_nanogpt_checkpoint_is_one_value_error_naming_it(tmp_path, make, match):
    path = tmp_path / "ckpt.pt"
    make(path, nanogpt_state_dict())
    with pytest.raises(ValueError, match=match) as e:
        from_nanogpt(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_nan_or_integer_hf_weights_are_refused_naming_tensor_and_file(tmp_path):
    save(tiny_gpt2(), tmp_path)
    good = load_file(tmp_path / "model.safetensors")
    for bad, match in (
        (good["transformer.h.1.attn.c_proj.weight"] * float("nan"), "holds NaN or infinite weights"),
        (good["transformer.h.1.attn.c_proj.weight"].long(), "is dtype torch.int64, not floating-point weights"),
        (good["transformer.h.1.attn.c_proj.weight"] > 0, "is dtype torch.bool"),
    ):
        save_file(good | {"transformer.h.1.attn.c_proj.weight": bad}, tmp_path / "model.safetensors")
        with pytest.raises(ValueError, match=match) as e:
            GPT.from_hf(tmp_path)
        assert "'transformer.h.1.attn.c_proj.weight'" in str(e.value) and "model.safetensors" in str(e.value)
    save_file(good | {"transformer.wte.weight": good["transformer.wte.weight"].half()}, tmp_path / "model.safetensors")
    assert GPT.from_hf(tmp_path).wte.weight.dtype == torch.float32  # float16 is weights: read and widened


def test_absurd_sizes_are_refused_before_anything_is_built(tmp_path):
    "A 1 KB edit once cost 30-140 s and 5.5 GB (a plan of 10**8 layers, a meta GPT of 10**7 blocks): now one line."
    save(tiny_gpt2(), tmp_path / "gpt2")
    save(tiny_llama(False), tmp_path / "llama")
    for folder, key in ((tmp_path / "gpt2", "n_layer"), (tmp_path / "llama", "num_hidden_layers")):
        shutil.copytree(folder, folder.with_name(folder.name + "_big"))
        edit_config(folder.with_name(folder.name + "_big"), **{key: 10**8})
    sd = nanogpt_state_dict()
    write_nanogpt_ckpt(tmp_path / "big.pt", sd, NANOGPT_ARGS | {"n_layer": 10**7})
    script = textwrap.dedent(f"""
        import resource, time
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # the old code needed 5.5 GB
        from gptbook.model import GPT
        from gptbook.hf import from_nanogpt
        for load, path in [(GPT.from_hf, "gpt2_big"), (GPT.from_hf, "llama_big"), (from_nanogpt, "big.pt")]:
            t0 = time.perf_counter()
            try:
                load({str(tmp_path)!r} + "/" + path)
            except ValueError as e:
                print(round(time.perf_counter() - t0, 1), "|", e)
        """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout + r.stderr[-2000:]
    for line, name in zip(lines, ("gpt2_big/config.json", "llama_big/config.json", "big.pt")):
        seconds, message = line.split(" | ")
        assert float(seconds) < 10 and name in message and "n_layers=" in message, line
        assert "more than this machine's" in message, message


# --- folders that are not what they claim (moved from test_bad_input) ------------------------------------------------


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return save(tiny_llama(False), tmp_path_factory.mktemp("hf") / "llama", max_shard_size="20KB")


def _copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def test_a_shard_outside_the_folder_is_refused(llama_folder, tmp_path):
    folder = _copy(llama_folder, tmp_path)
    index = folder / "model.safetensors.index.json"
    contents = json.loads(index.read_text())
    shard = sorted(set(contents["weight_map"].values()))[0]
    (tmp_path / "elsewhere").mkdir()
    shutil.move(folder / shard, tmp_path / "elsewhere" / shard)  # the old loader read it from there
    for bad in (f"../elsewhere/{shard}", str(tmp_path / "elsewhere" / shard), ".", ""):
        contents["weight_map"] = {k: bad if v == shard else v for k, v in contents["weight_map"].items()}
        index.write_text(json.dumps(contents))
        with pytest.raises(ValueError, match="which is not a file inside"):
            load_hf(folder)
        contents["weight_map"] = {k: shard if v == bad else v for k, v in contents["weight_map"].items()}


def _set(key, value):
    "An edit of config.json that sets one key."
    return lambda text: json.dumps({**json.loads(text), key: value})


def _drop(key):
    return lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != key})


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda text: text[:30], r"config\.json is not a valid JSON file"),
        (lambda text: text.encode("utf-16"), r"config\.json is not a valid JSON file"),
        (lambda text: "[1, 2]", r"config\.json holds a list, not the JSON object"),
        (_drop("num_hidden_layers"), r"config\.json has no 'num_hidden_layers', which a llama config must have"),
        (_set("architectures", "LlamaForCausalLM"), r"config\.json has architectures='LlamaForCausalLM'"),
        (_set("num_attention_heads", "4"), r"config\.json: "),
        (_set("num_hidden_layers", 0), r"config\.json: n_layers must be at least 1, got 0"),
        (_set("rope_parameters", {"rope_theta": "fast"}), r"config\.json: could not convert"),
        (_set("rope_parameters", "fast"), r"config\.json: "),
        (_set("max_position_embeddings", 10**10), r"config\.json: max_seq_len=10,000,000,000 makes a model of"),
    ],
)
def test_a_malformed_config_is_one_line_naming_config_json(llama_folder, tmp_path, edit, match):
    folder = _copy(llama_folder, tmp_path)
    cfg_file = folder / "config.json"
    new = edit(cfg_file.read_text())
    if isinstance(new, bytes):
        cfg_file.write_bytes(new)
    else:
        cfg_file.write_text(new)
    with pytest.raises(ValueError, match=match) as e:
        load_hf(folder)
    assert str(cfg_file) in str(e.value) and "\n" not in str(e.value)


def test_a_damaged_shard_names_the_file(llama_folder, tmp_path):
    folder = _copy(llama_folder, tmp_path)
    shard = sorted(folder.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError, match=rf"{shard.name} cannot be read .*download it again"):
        load_hf(folder)


def test_the_checked_folder_still_loads(llama_folder):
    assert GPT.from_hf(llama_folder).config.max_seq_len == 32
    config, state_dict = load_hf(llama_folder)
    assert config.n_layers == 3 and state_dict["lm_head.weight"].dtype == torch.float32
