"""Claims of the lab (12_lab) and of Reading nanoGPT (11_nanogpt): the NumPy model generates the same tokens
as PyTorch's KV-cached `generate`, past the context length; shared-uniform sampling gives the same tokens from
either forward pass; float32 NumPy logits stay float32 and within 1e-4; and a state dict renamed to nanoGPT's keys
maps back."""

import numpy as np
import pytest
import torch

from gptbook.model import GPT, GPTConfig
from gptbook.sample import generate
from gptbook.scratch import model as npm

CONFIGS = {
    "gpt2": GPTConfig.baby(37, n_layers=2, n_heads=4, d_model=32, max_seq_len=16),
    "llama": GPTConfig.llama_style(vocab_size=37, max_seq_len=16, n_layers=2, n_heads=4, d_model=32, n_kv_heads=2),
}


def make(cfg, seed=0, std=0.3):
    "A model with random weights everywhere (norm gains around 1, biases non-zero), in eval mode."
    torch.manual_seed(seed)
    m = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.normal_(1.0 if "ln" in name and name.endswith("weight") else 0.0, std)
    return m


def numpy_params(m, dtype):
    return {k: v.detach().numpy().astype(dtype) for k, v in m.state_dict().items()}


def numpy_greedy(params, cfg, prompt, n):
    "Greedy decoding with the NumPy forward pass and no cache: crop to max_seq_len, argmax of the last logits."
    seq = list(prompt)
    for _ in range(n):
        logits = npm.forward(params, np.array([seq[-cfg.max_seq_len :]]), cfg)[0, -1]
        seq.append(int(np.argmax(logits)))
    return seq


def inverse_cdf_sample(next_logits, prompt, n, max_seq_len, temperature, u):
    seq = list(prompt)
    for s in range(n):
        z = np.asarray(next_logits(np.array([seq[-max_seq_len:]])), dtype=np.float64) / temperature
        p = np.exp(z - z.max())
        cdf = np.cumsum(p / p.sum())
        seq.append(int(min(np.searchsorted(cdf, u[s], side="right"), len(cdf) - 1)))
    return seq


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numpy_greedy_matches_torch_generate_past_the_context(name, dtype):
    cfg = CONFIGS[name]
    m = make(cfg)
    prompt = [3, 1, 4, 1, 5]
    n = 3 * cfg.max_seq_len  # far past the context: the crop is used at most steps
    ref = generate(m, torch.tensor([prompt]), n, temperature=0)[0].tolist()
    assert numpy_greedy(numpy_params(m, dtype), cfg, prompt, n) == ref


@pytest.mark.parametrize("name", list(CONFIGS))
def test_shared_uniform_sampling_matches(name):
    cfg = CONFIGS[name]
    m = make(cfg, seed=1)
    params = numpy_params(m, np.float32)
    u = np.random.default_rng(0).random(40)

    def torch_next(ids):
        with torch.no_grad():
            return m(torch.from_numpy(ids))[0, -1].numpy()

    def numpy_next(ids):
        return npm.forward(params, ids, cfg)[0, -1]

    a = inverse_cdf_sample(numpy_next, [2, 7], 40, cfg.max_seq_len, 0.8, u)
    b = inverse_cdf_sample(torch_next, [2, 7], 40, cfg.max_seq_len, 0.8, u)
    assert a == b
    assert len(set(a[2:])) > 3  # a real sample, not a constant run


@pytest.mark.parametrize("name", list(CONFIGS))
def test_float32_numpy_forward_stays_float32_and_close(name):
    cfg = CONFIGS[name]
    m = make(cfg, seed=2)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    got = npm.forward(numpy_params(m, np.float32), idx.numpy(), cfg)
    assert got.dtype == np.float32
    with torch.no_grad():
        ref = m(idx).numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)


# nanoGPT's own names and shapes, recorded from its model.py at commit 3adf61e:
# GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, bias=True)).state_dict()
NANOGPT_TOP = {
    "transformer.wte.weight": (65, 128),
    "transformer.wpe.weight": (64, 128),
    "transformer.ln_f.weight": (128,),
    "transformer.ln_f.bias": (128,),
    "lm_head.weight": (65, 128),
}
NANOGPT_LAYER = {
    "ln_1.weight": (128,),
    "ln_1.bias": (128,),
    "attn.c_attn.weight": (384, 128),
    "attn.c_attn.bias": (384,),
    "attn.c_proj.weight": (128, 128),
    "attn.c_proj.bias": (128,),
    "ln_2.weight": (128,),
    "ln_2.bias": (128,),
    "mlp.c_fc.weight": (512, 128),
    "mlp.c_fc.bias": (512,),
    "mlp.c_proj.weight": (128, 512),
    "mlp.c_proj.bias": (128,),
}


def test_nanogpt_key_renaming_round_trips():
    "gptbook's keys differ from nanoGPT's only by the `transformer.` prefix and `h.` for `blocks.` (chapter 11)."

    def nanogpt_key(key):
        if key.startswith("lm_head."):
            return key
        if key.startswith("blocks."):
            return "transformer.h." + key[len("blocks.") :]
        return "transformer." + key

    m = GPT(GPTConfig.baby(65))
    theirs = {nanogpt_key(k): tuple(v.shape) for k, v in m.state_dict().items()}
    expected = NANOGPT_TOP | {f"transformer.h.{i}.{k}": shape for i in range(4) for k, shape in NANOGPT_LAYER.items()}
    assert theirs == expected  # every tensor maps to nanoGPT's name with nanoGPT's shape, and nothing is left over
    back = {
        k[len("transformer.") :].replace("h.", "blocks.", 1) if k.startswith("transformer.") else k: v
        for k, v in zip(theirs, m.state_dict().values())
    }
    GPT(GPTConfig.baby(65)).load_state_dict(back, strict=True)
