"""Claims of the lab (12_lab) and of Reading nanoGPT (11_nanogpt): the NumPy model generates the same tokens
as PyTorch's KV-cached `generate`, past the context length; shared-uniform sampling gives the same tokens from
either forward pass; float32 NumPy logits stay float32 and within 1e-4; a state dict renamed to nanoGPT's keys
maps back; and the NumPy backward pass, AdamW step and clipping equal autograd, torch.optim.AdamW and
clip_grad_norm_ (and finite differences), so that NumPy training steps give the losses of gptbook's Trainer."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from gptbook.data import get_batch, load_token_data
from gptbook.model import GPT, GPTConfig
from gptbook.sample import generate
from gptbook.train import TrainConfig, Trainer, make_optimizer, param_groups
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


# --- the lab trains: the NumPy backward pass and AdamW (gptbook.scratch.model) against torch -----------------------
# Every tolerance below is relative to the largest entry of the array compared, because gradients span orders of
# magnitude. float64: each operation rounds at ~1e-16 relative, and the error grows with depth (measured 5e-15 at one
# layer to 2e-14 at sixteen, weights of std 0.3); 1e-10 leaves four orders of magnitude and is still far below any real
# mistake (a forgotten LayerNorm term is off by ~1e-1). float32: ~6e-8 per rounding, sums of thousands of products;
# measured ~3e-6, tolerance 1e-4.

GPT2_DESIGNS = {  # GPT-2's design, with and without biases, tied and untied
    "tied+bias": dict(),
    "untied, no bias": dict(bias=False, tie_weights=False),
}


def gpt2(design, n_layers=2, **sizes):
    sizes = dict(n_heads=4, d_model=32, max_seq_len=16) | sizes
    return GPTConfig.baby(37, n_layers=n_layers, **sizes, **GPT2_DESIGNS[design])


def batch(cfg, seed=0, B=3):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab_size, (B, cfg.max_seq_len), generator=g)
    return idx, torch.randint(0, cfg.vocab_size, (B, cfg.max_seq_len), generator=g)


def torch_grads(m, idx, targets):
    "autograd's loss and gradients keyed like the state_dict (a tied tensor under both names)."
    m.zero_grad()
    loss = F.cross_entropy(m(idx).flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.item(), {k: p.grad.numpy() for k, p in m.state_dict(keep_vars=True).items()}


def worst_relative(ours, ref):
    return max(np.abs(ours[k] - r).max() / np.abs(r).max() for k, r in ref.items())


@pytest.mark.parametrize("design", list(GPT2_DESIGNS))
@pytest.mark.parametrize("n_layers", [1, 3, 8])
def test_gradients_equal_autograd_in_float64(design, n_layers):
    cfg = gpt2(design, n_layers)
    m = make(cfg, seed=n_layers).double()
    idx, targets = batch(cfg)
    params = numpy_params(m, np.float64)
    loss, grads = npm.loss_and_grads(params, idx.numpy(), targets.numpy(), cfg)
    ref_loss, ref = torch_grads(m, idx, targets)
    assert list(grads) == list(params)  # keyed exactly like the state dict, in its order
    assert all(grads[k].shape == params[k].shape and grads[k].dtype == np.float64 for k in params)
    assert worst_relative(grads, ref) < 1e-10
    assert abs(loss - ref_loss) < 1e-12
    if cfg.tie_weights:
        assert grads["lm_head.weight"] is grads["wte.weight"]  # one array under both names, as the one tensor
    assert "blocks.0.attn.c_attn.bias" in grads if cfg.bias else not any(k.endswith("bias") for k in grads)


@pytest.mark.parametrize("design", list(GPT2_DESIGNS))
def test_gradients_equal_autograd_in_float32(design):
    cfg = gpt2(design, 3)
    m = make(cfg, seed=5)
    idx, targets = batch(cfg, seed=1)
    loss, grads = npm.loss_and_grads(numpy_params(m, np.float32), idx.numpy(), targets.numpy(), cfg)
    ref_loss, ref = torch_grads(m, idx, targets)
    assert all(g.dtype == np.float32 for g in grads.values())  # float32 from the lookup to the last gradient
    assert worst_relative(grads, ref) < 1e-4
    assert abs(loss - ref_loss) < 1e-5


def test_the_tolerance_catches_a_real_mistake():
    "A backward without LayerNorm's variance term (a classic slip) is far outside the float64 tolerance."
    cfg = gpt2("tied+bias")
    m = make(cfg).double()
    x = np.random.default_rng(0).standard_normal((2, 16, 32))
    ln = m.blocks[0].ln_1
    y, cache = npm.layer_norm_forward(x, ln.weight.detach().numpy(), ln.bias.detach().numpy())
    dy = np.random.default_rng(1).standard_normal(y.shape)
    x_t = torch.from_numpy(x).requires_grad_()
    ln(x_t).backward(torch.from_numpy(dy))
    dx, _ = npm.layer_norm_backward(dy, cache)
    x_hat, r, w, _ = cache
    g = dy * w
    wrong = r * (g - g.mean(-1, keepdims=True))
    assert np.abs(dx - x_t.grad.numpy()).max() < 1e-10 < 1e-3 < np.abs(wrong - x_t.grad.numpy()).max()


def test_gradients_equal_finite_differences():
    "Central differences of chapter 6's forward pass (independent of both backward passes), at random entries."
    cfg = gpt2("untied, no bias")
    m = make(cfg, seed=3).double()
    idx, targets = (t.numpy() for t in batch(cfg, seed=2))
    params = numpy_params(m, np.float64)
    _, grads = npm.loss_and_grads(params, idx, targets, cfg)
    rng = np.random.default_rng(0)
    h = 1e-6  # error: O(h^2) from the Taylor series plus ~1e-16 * L / h from rounding, ~1e-9 in all

    def loss_at(name, i, delta):
        p = dict(params)
        p[name] = params[name].copy()
        p[name][i] += delta
        return npm.cross_entropy(npm.forward(p, idx, cfg), targets)[0]

    for name in params:
        i = tuple(int(rng.integers(n)) for n in params[name].shape)
        numerical = (loss_at(name, i, h) - loss_at(name, i, -h)) / (2 * h)
        assert abs(numerical - grads[name][i]) < 1e-7, name


def test_key_bias_gradient_is_rounding_noise():
    "Adding b to every key adds q.b to a whole row of scores, which softmax ignores: the gradient is exactly 0."
    cfg = gpt2("tied+bias")
    m = make(cfg).double()
    idx, targets = (t.numpy() for t in batch(cfg))
    _, grads = npm.loss_and_grads(numpy_params(m, np.float64), idx, targets, cfg)
    bias, C = grads["blocks.0.attn.c_attn.bias"], cfg.d_model
    assert np.abs(bias[C : 2 * C]).max() < 1e-12 < 1e-3 < np.abs(bias[:C]).max()  # keys: noise; queries: not


def test_loss_and_grads_refuses_other_designs_in_one_line():
    idx = np.zeros((1, 4), dtype=np.int64)
    for cfg in (CONFIGS["llama"], GPTConfig.baby(37, norm_position="post"), GPTConfig.baby(37, ffn="gelu")):
        params = numpy_params(GPT(cfg), np.float64)
        with pytest.raises(ValueError, match="GPT-2's design") as e:
            npm.loss_and_grads(params, idx, idx, cfg)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("design", list(GPT2_DESIGNS))
def test_decays_picks_the_trainers_groups(design):
    m = GPT(gpt2(design))
    decayed = {id(p) for p in param_groups(m, 0.1)[0]["params"]}
    named = dict(m.named_parameters())  # a tied tensor once, under its first name
    assert {k for k, p in named.items() if id(p) in decayed} == {k for k, p in named.items() if npm.decays(k, p)}


@pytest.mark.parametrize("design", list(GPT2_DESIGNS))
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-13), (np.float32, 1e-6)])
def test_adamw_step_equals_torch_adamw(design, dtype, tol):
    """The trainer's optimizer and adamw_step, fed the same gradients for 5 steps at lr 1e-2, end at the same weights.
    The two compute the same formulas in a different order: they differ by an ulp or so of the weights (measured
    2e-16 in float64, 6e-8 in float32, for weights of order 1); the tolerances leave a factor of about 500."""
    cfg = gpt2(design)
    m = make(cfg, seed=4, std=0.1).to(torch.float64 if dtype == np.float64 else torch.float32)
    params, state = numpy_params(m, dtype), {}
    opt = make_optimizer(m, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    named = dict(m.named_parameters())
    rng = np.random.default_rng(0)
    for _ in range(5):
        idx, targets = (t.numpy() for t in batch(cfg, seed=int(rng.integers(1000))))
        _, grads = npm.loss_and_grads(params, idx, targets, cfg)
        for k, p in named.items():
            p.grad = torch.from_numpy(grads[k].copy())
        opt.step()
        npm.adamw_step(params, grads, state, lr=1e-2)
    after = numpy_params(m, dtype)
    start = numpy_params(make(cfg, seed=4, std=0.1), dtype)
    assert max(np.abs(after[k] - start[k]).max() for k in after) > 1e-2  # the steps did move the weights
    assert max(np.abs(params[k] - after[k]).max() for k in after) < tol
    if cfg.tie_weights:
        assert params["lm_head.weight"] is params["wte.weight"]  # stepped once, one array under both names


def test_clip_grad_norm_equals_torch():
    cfg = gpt2("tied+bias")
    m = make(cfg).double()
    idx, targets = batch(cfg)
    _, grads = npm.loss_and_grads(numpy_params(m, np.float64), idx.numpy(), targets.numpy(), cfg)
    torch_grads(m, idx, targets)
    norm = npm.clip_grad_norm(grads, 0.5)
    ref_norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5).item()
    assert norm > 0.5 and abs(norm - ref_norm) < 1e-12 * ref_norm  # a tied array counted once, as torch does
    assert worst_relative(grads, {k: p.grad.numpy() for k, p in m.state_dict(keep_vars=True).items()}) < 1e-12


@pytest.mark.slow
def test_numpy_training_steps_equal_gptbooks_trainer(tmp_path):
    """20 steps of the trainer's recipe in NumPy (get_batch with the trainer's seeded generator, lr_at, clipping,
    adamw_step) against gptbook's own Trainer.train_step, float32, from the same weights: losses to float32 resolution
    (the losses are ~4, one float32 ulp 5e-7; the chapter measured 7e-7 over 300 steps)."""
    data = load_token_data("char")
    cfg = GPTConfig.baby(data.vocab_size, n_layers=1, d_model=32, max_seq_len=32)
    tcfg = TrainConfig(
        out_dir=str(tmp_path), max_iters=20, warmup_iters=5, batch_size=4, device="cpu", dtype="float32", progress=False
    )
    torch.manual_seed(0)
    model = GPT(cfg)
    params, state = numpy_params(model, np.float32), {}
    trainer = Trainer(model, data, tcfg)
    g = torch.Generator().manual_seed(tcfg.seed)  # the trainer's batch generator
    for step in range(tcfg.max_iters):
        x, y = get_batch(data.train, tcfg.batch_size, cfg.max_seq_len, g)
        loss, grads = npm.loss_and_grads(params, x.numpy(), y.numpy(), cfg)
        norm = npm.clip_grad_norm(grads, tcfg.grad_clip)
        npm.adamw_step(params, grads, state, tcfg.lr_at(step), (tcfg.beta1, tcfg.beta2), weight_decay=tcfg.weight_decay)
        ref = trainer.train_step()
        assert abs(loss - ref["loss"]) < 1e-5 and abs(norm - ref["grad_norm"]) < 1e-4 * ref["grad_norm"]
    after = numpy_params(model, np.float32)
    C = cfg.d_model
    for k in after:  # the key biases excepted: Adam turns their rounding-noise gradients into steps of up to lr
        d = np.abs(params[k] - after[k])
        if k.endswith("attn.c_attn.bias"):
            d = np.concatenate([d[:C], d[2 * C :]])
        assert d.max() < 1e-5, k
