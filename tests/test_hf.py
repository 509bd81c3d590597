"""GPT.from_hf against `transformers` (a dev dependency): random tiny GPT-2 and Llama models saved with
save_pretrained, loaded with GPT.from_hf, equal logits; and clear errors for folders that do not fit."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from gptbook.hf import clean_state_dict, config_from_hf, load_hf  # noqa: E402
from gptbook.model import GPT, GPTConfig  # noqa: E402

transformers.logging.set_verbosity_error()
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


def test_config_from_hf_older_llama_keys():
    "Older transformers write rope_theta at the top level and no rope_parameters."
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


def test_model_does_not_import_hf():
    "gptbook.hf imports gptbook.model; the model imports gptbook.hf only inside GPT.from_hf, so there is no circle."
    import subprocess
    import sys

    code = "import sys, gptbook.model; assert 'gptbook.hf' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
