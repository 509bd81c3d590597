"""The reliability review's bad inputs for the tokenizer, model, data, sampler and Hugging Face loader
(../shared/reviews/reliability.md, issue 12): each test reproduces the report's case and asserts the
one-line error, or the safe behaviour, that replaced the traceback. test_<finding>_... names the finding."""

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from gptbook import sample as sample_module
from gptbook.data import ChecksumError, download, load_token_data, save_tokens, tiny_shakespeare
from gptbook.model import GPT, GPTConfig
from gptbook.options import OptionError, field_types, split_optional
from gptbook.sample import SamplingConfig, generate, generate_steps, stream
from gptbook.tokenizer import BPETokenizer, CharTokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=65, max_seq_len=16, n_layers=1, n_heads=2, d_model=32)


@pytest.fixture
def cache_home(monkeypatch, tmp_path):
    "A private, empty $XDG_CACHE_HOME."
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gptbook" / "tokens"


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return GPT(GPTConfig(**TINY)).eval()


def write(path: Path, content) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


# --- D7: damaged tokenizer and data files are one line naming the file ---------------------------------------------


@pytest.mark.parametrize(
    "contents",
    [
        {"type": "char"},  # the report's case: KeyError 'chars'
        {"type": "char", "chars": None},
        {"type": "char", "chars": [1, 2]},
        {"type": "bpe"},  # KeyError 'merges'
        {"type": "bpe", "merges": 5},
        {"type": "bpe", "merges": [5]},
        {"type": "bpe", "merges": [], "special_tokens": 5},
    ],
)
def test_d7_tokenizer_file_without_its_fields_names_the_file(tmp_path, contents):
    path = write(tmp_path / "tokenizer.json", contents)
    with pytest.raises(ValueError) as e:
        load_tokenizer(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("loader", [load_tokenizer, CharTokenizer.load, BPETokenizer.load])
def test_d7_tokenizer_file_not_utf8_or_not_json_names_the_file(tmp_path, loader):
    latin1 = write(tmp_path / "latin1.json", '{"type": "char", "chars": ["é"]}'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.json is not UTF-8 text \(byte 0xe9 at position 28\)"):
        loader(latin1)
    torn = write(tmp_path / "torn.json", b'{"type": "char", "chars": ["a", ')
    with pytest.raises(ValueError, match=r"torn\.json is not valid JSON"):
        loader(torn)


def test_d7_data_file_not_utf8_names_the_file(tmp_path):
    path = write(tmp_path / "latin1.txt", "Où est la café?".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8 text \(byte 0xf9 at position 1\): convert it"):
        load_token_data("char", path=path)
    binary = write(tmp_path / "binary.bin", bytes([0xA9, 0x00, 0xFF]) * 10)
    with pytest.raises(ValueError, match=r"binary\.bin is not UTF-8 text \(byte 0xa9 at position 0\)"):
        load_token_data("bpe", vocab_size=300, path=binary, cache=False)


# --- D9: generate checks max_new_tokens against memory before allocating --------------------------------------------


def test_d9_generate_refuses_an_output_that_cannot_fit_before_allocating(tiny_model):
    idx = torch.tensor([[1, 2, 3]])
    with pytest.raises(OptionError, match=r"max_new_tokens=1,000,000,000,000 asks generate for a \(1, ") as e:
        generate(tiny_model, idx, 10**12)  # 8 TB of ids: the old code tried new_zeros((1, 10**12))
    assert e.value.field == "max_new_tokens" and "stream()" in str(e.value)


def test_d9_the_check_uses_the_memory_that_is_free(tiny_model, monkeypatch):
    monkeypatch.setattr(sample_module, "_free_bytes", lambda device: 10**6)  # as under a tight `ulimit -v`
    with pytest.raises(OptionError, match=r"more than the 0\.0 GiB free on cpu"):
        generate(tiny_model, torch.tensor([[1, 2]]), 100_000)  # 2.4 MB with the working copies
    assert generate(tiny_model, torch.tensor([[1, 2]]), 5).shape == (1, 7)  # small requests still run


def test_d9_free_memory_is_known_on_linux():
    free = sample_module._free_bytes(torch.device("cpu"))
    if sys.platform.startswith("linux"):
        assert free is not None and free > 0


def test_d9_generate_grows_its_buffer_and_gives_the_same_tokens(tiny_model):
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
    n = 1500  # past the first 1,024-column buffer
    out = generate(tiny_model, idx, n, temperature=0)
    steps = torch.stack([tok for tok, _ in generate_steps(tiny_model, idx, n, temperature=0)], dim=1)
    assert out.shape == (2, 3 + n)
    assert torch.equal(out[:, 3:], steps)


def test_d9_stream_keeps_no_buffer_so_any_max_new_tokens_starts_at_once(tiny_model):
    tok = CharTokenizer([chr(32 + i) for i in range(65)])
    t0 = time.perf_counter()
    first = next(stream(tiny_model, tok, "AB", 10**12, generator=torch.Generator().manual_seed(0)))
    assert first and time.perf_counter() - t0 < 30


# --- D11 / W5: every float field refuses NaN and inf ----------------------------------------------------------------


def _float_fields(cls):
    return [name for name, hint in field_types(cls).items() if split_optional(hint)[0] is float]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("name", _float_fields(GPTConfig))
def test_d11_gpt_config_float_fields_refuse_nan_and_inf(name, bad):
    with pytest.raises(OptionError, match=f"{name} must be a finite number") as e:
        GPTConfig(**TINY, **{name: bad})
    assert e.value.field == name


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("name", _float_fields(SamplingConfig))
def test_w5_sampling_config_float_fields_refuse_nan_and_inf(name, bad):
    with pytest.raises(OptionError, match=f"{name} must be a finite number") as e:
        SamplingConfig(**{name: bad})
    assert e.value.field == name


def test_w5_the_float_fields_are_the_ones_the_report_names():
    assert set(_float_fields(GPTConfig)) == {"dropout", "rope_base", "norm_eps"}
    assert set(_float_fields(SamplingConfig)) == {"temperature", "top_p", "min_p", "repetition_penalty"}


# --- W8: a tokenizer file's regex cannot hang encode; a bad one is a ValueError naming the file --------------------

_HOSTILE = r"(a|aa)+$|[\s\S]"  # the report's pattern: exponential backtracking on "a" * 40 + "!"


def test_w8_a_hostile_pattern_from_a_file_cannot_hang_encode(tmp_path):
    path = write(tmp_path / "tokenizer.json", {"type": "bpe", "version": 1, "pattern": _HOSTILE, "merges": []})
    script = textwrap.dedent(f"""
        import time
        from gptbook.tokenizer import load_tokenizer
        tok, t0 = load_tokenizer({str(path)!r}), time.perf_counter()
        try:
            tok.encode("a" * 40 + "!")
            print("encoded")
        except ValueError as e:
            print("ValueError", round(time.perf_counter() - t0, 1), e)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:  # in a child process, so that the old, unbounded code fails the test instead of hanging it
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("encode ran for over 60 s on a 41-character text")
    assert out.stdout.startswith("ValueError"), out.stdout + out.stderr
    assert "ReDoS" in out.stdout and float(out.stdout.split()[1]) < 10


def test_w8_patterns_still_work_under_the_time_limit():
    text = "It's 42 o'clock, ROMEO!\n" * 200
    tok = BPETokenizer.train(text, 262, pattern=r"\w+|\s+|[^\w\s]+")  # a custom pattern takes the timed path
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("pattern,exc,match", [("(a", ValueError, "is not a valid regex"), (5, TypeError, "pattern")])
def test_w8_a_bad_pattern_names_the_file(tmp_path, pattern, exc, match):
    path = write(tmp_path / "tokenizer.json", {"type": "bpe", "pattern": pattern, "merges": []})
    with pytest.raises(ValueError, match=match) as e:  # a damaged file is a ValueError, whatever is wrong in it
        load_tokenizer(path)
    assert str(e.value).startswith(str(path))
    with pytest.raises(exc, match=match):
        BPETokenizer.train("ab cd", 260, pattern=pattern)  # regex.error before


# --- W9: from_hf / load_hf -------------------------------------------------------------------------------------------


def _tiny_llama(folder: Path, **kw) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        **kw,
    )
    transformers.logging.set_verbosity_error()
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(folder, max_shard_size="20KB")
    return folder


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return _tiny_llama(tmp_path_factory.mktemp("hf") / "llama")


def _copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def test_w9_a_shard_outside_the_folder_is_refused(llama_folder, tmp_path):
    from gptbook.hf import load_hf

    folder = _copy(llama_folder, tmp_path)
    index = folder / "model.safetensors.index.json"
    contents = json.loads(index.read_text())
    shard = sorted(set(contents["weight_map"].values()))[0]
    (tmp_path / "elsewhere").mkdir()
    shutil.move(folder / shard, tmp_path / "elsewhere" / shard)  # the old loader read it from there
    contents["weight_map"] = {k: f"../elsewhere/{v}" if v == shard else v for k, v in contents["weight_map"].items()}
    index.write_text(json.dumps(contents))
    with pytest.raises(ValueError, match=r"lists the shard '\.\./elsewhere/.*which is not a file inside"):
        load_hf(folder)
    contents["weight_map"] = {k: str(tmp_path / "elsewhere" / shard) for k in contents["weight_map"]}  # absolute
    index.write_text(json.dumps(contents))
    with pytest.raises(ValueError, match="which is not a file inside"):
        load_hf(folder)


def test_w9_a_huge_context_is_refused_before_the_rope_tables_are_built(llama_folder, tmp_path):
    from gptbook.hf import load_hf

    folder = _copy(llama_folder, tmp_path)
    cfg_file = folder / "config.json"
    cfg_file.write_text(_set("max_position_embeddings", 10**9)(cfg_file.read_text()))
    with pytest.raises(ValueError, match=r"config\.json has max_position_embeddings=1,000,000,000: its RoPE tables"):
        load_hf(folder)  # the old loader accepted it, and GPT(config) then allocated gigabytes of tables
    with pytest.raises(ValueError, match="lower max_position_embeddings"):
        GPT.from_hf(folder)


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
    ],
)
def test_w9_a_malformed_config_is_one_line_naming_config_json(llama_folder, tmp_path, edit, match):
    from gptbook.hf import load_hf

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


def test_w9_a_damaged_shard_names_the_file(llama_folder, tmp_path):
    from gptbook.hf import load_hf

    folder = _copy(llama_folder, tmp_path)
    shard = sorted(folder.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError, match=rf"{shard.name} cannot be read .*download it again"):
        load_hf(folder)


def test_w9_the_checked_folder_still_loads(llama_folder):
    model = GPT.from_hf(llama_folder)
    assert model.config.max_seq_len == 32


# --- W10: the BPE token cache is checked before use ------------------------------------------------------------------


@pytest.fixture
def small_text(tmp_path, shakespeare):
    path = tmp_path / "small.txt"
    path.write_text(shakespeare[:20_000], encoding="utf-8")
    return path


def _load_quietly(path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = load_token_data("bpe", vocab_size=300, path=path)
    return data, [str(w.message) for w in caught if "token cache" in str(w.message)]


def test_w10_a_poisoned_ids_file_is_rebuilt_not_trained_on(cache_home, small_text):
    fresh, notes = _load_quietly(small_text)
    expected = np.array(fresh.train)
    assert notes == []
    (ids_file,) = cache_home.glob("bpe300-*.bin")
    save_tokens(np.arange(34) % 256, ids_file)  # the report's 34-token pickle payload, as ids
    again, notes = _load_quietly(small_text)
    assert len(notes) == 1 and str(ids_file) in notes[0] and "rebuilding it" in notes[0]
    assert np.array_equal(np.array(again.train), expected)
    _, notes = _load_quietly(small_text)  # the rebuilt entry is trusted again
    assert notes == []


def test_w10_same_length_damage_and_a_foreign_tokenizer_are_caught(cache_home, small_text, tmp_path):
    fresh, _ = _load_quietly(small_text)
    expected = np.array(fresh.train)
    (ids_file,) = cache_home.glob("bpe300-*.bin")
    ids_file.write_bytes(bytes(ids_file.stat().st_size))  # the same length, all zeros
    again, notes = _load_quietly(small_text)
    assert len(notes) == 1 and np.array_equal(np.array(again.train), expected)
    (tok_file,) = [p for p in cache_home.glob("bpe300-*.json") if not p.name.endswith(".meta.json")]
    other = BPETokenizer.train("something else entirely " * 50, 280)
    other.save(tok_file)
    again, notes = _load_quietly(small_text)
    assert len(notes) == 1 and "tokenizer" in notes[0]
    assert np.array_equal(np.array(again.train), expected) and again.tokenizer.merges == fresh.tokenizer.merges


def test_w10_another_texts_entry_under_this_name_is_caught(cache_home, small_text, tmp_path):
    other_text = tmp_path / "other.txt"
    other_text.write_text(small_text.read_text()[::-1], encoding="utf-8")
    mine, _ = _load_quietly(small_text)
    expected = np.array(mine.train)
    _load_quietly(other_text)
    ours, theirs = (f"bpe300-{hashlib.sha256(p.read_bytes()).hexdigest()[:16]}" for p in (small_text, other_text))
    for ext in (".json", ".bin", ".meta.json"):  # a complete, self-consistent entry, of another text
        shutil.copy(cache_home / f"{theirs}{ext}", cache_home / f"{ours}{ext}")
    again, notes = _load_quietly(small_text)
    assert len(notes) == 1 and np.array_equal(np.array(again.train), expected)


# --- W11 and item 6: decode takes integers in the vocabulary only, and says what the vocabulary is -----------------


@pytest.mark.parametrize("bad", [[1.0], [True], [104, 2.0], np.array([1.0]), torch.tensor([1.0])])
def test_w11_bpe_decode_rejects_floats_and_bools_on_the_fast_path(bad):
    tok = BPETokenizer.train("hello world", 260)
    with pytest.raises(TypeError, match="token ids must be integers, got"):
        tok.decode(bad)  # the old fast path returned '\x01' for [1.0] and [True]


@pytest.mark.parametrize("bad", [[1.0], [True], [False]])
def test_w11_char_decode_rejects_floats_and_bools(bad):
    with pytest.raises(TypeError, match="token ids must be integers"):
        CharTokenizer.train("ab").decode(bad)


def test_w11_integer_ids_of_every_kind_still_decode():
    tok, ct = BPETokenizer.train("hello world", 260), CharTokenizer.train("hi")
    for ids in ([104, 105], (104, 105), np.array([104, 105]), torch.tensor([104, 105]), [np.int64(104), 105]):
        assert tok.decode(ids) == "hi"
    for ids in ([0, 1], np.array([0, 1], dtype=np.uint16), torch.tensor([0, 1]), []):
        assert ct.decode(ids) == "hi"[: len(ids)]


def test_item6_out_of_range_ids_name_the_vocabulary_size(tiny_model):
    tok = BPETokenizer.train("hello world", 260)
    with pytest.raises(ValueError, match=r"id 260 is not in this tokenizer's vocabulary \(vocab_size is 260, ids"):
        tok.decode([260])
    with pytest.raises(ValueError, match=r"id -1 is not a valid CharTokenizer id \(vocab_size is 2"):
        CharTokenizer.train("ab").decode([-1])
    with pytest.raises(
        ValueError, match=r"token id 70 in idx is outside the model's vocabulary 0..64 \(vocab_size=65\)"
    ):
        generate(tiny_model, torch.tensor([[70]]), 3)
    with pytest.raises(OptionError, match=r"stop token id 99 .*\(vocab_size=65\)"):
        generate(tiny_model, torch.tensor([[1]]), 3, stop=99)


# --- W12: GPT.forward names a bad id and the vocabulary size ---------------------------------------------------------


@pytest.mark.parametrize("bad,id_", [([[0, 65]], 65), ([[-1, 3]], -1), ([[3, 10**6]], 10**6)])
def test_w12_forward_names_an_out_of_range_id_and_vocab_size(tiny_model, bad, id_):
    for dtype in (torch.long, torch.int32):
        with pytest.raises(
            ValueError, match=rf"token id {id_} in idx is outside the vocabulary 0\.\.64 \(vocab_size=65\)"
        ):
            tiny_model(torch.tensor(bad, dtype=dtype))


def test_w12_forward_refuses_float_ids_and_lists(tiny_model):
    with pytest.raises(TypeError, match="idx must hold integer token ids .*got dtype torch.float32"):
        tiny_model(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(TypeError, match="idx must be a torch.Tensor of token ids, got list"):
        tiny_model([[1, 2]])


def test_w12_forward_checks_targets_but_keeps_the_ignore_index(tiny_model):
    idx = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"token id 65 in targets is outside the vocabulary"):
        tiny_model(idx, targets=torch.tensor([[1, 2, 65]]))
    _, loss = tiny_model(idx, targets=torch.tensor([[-100, 2, 3]]))  # cross_entropy's ignore_index
    assert torch.isfinite(loss)
    assert tiny_model(torch.zeros(0, 4, dtype=torch.long)).shape == (0, 4, 65)  # empty batches need no check


# --- W13: what these modules write follows the user's umask ---------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_w13_writers_follow_the_umask(cache_home, tmp_path, umask):
    old = os.umask(umask)
    try:
        files = [
            *_written_by_tokenizers(tmp_path),
            save_tokens(np.arange(10), tmp_path / "ids.bin"),
            download((tmp_path / "ids.bin").as_uri(), tmp_path / "downloaded.bin"),
        ]
        load_token_data("bpe", vocab_size=260, path=_text_file(tmp_path))
        files += sorted(cache_home.iterdir())
        folders = [cache_home, cache_home.parent]
    finally:
        os.umask(old)
    assert len(files) >= 6  # 2 tokenizers, 2 id files, the cache entry (ids, tokenizer, and its .meta.json)
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f
    for d in folders:
        assert d.stat().st_mode & 0o777 == 0o777 & ~umask, d


def _written_by_tokenizers(folder: Path) -> list:
    CharTokenizer.train("abc").save(folder / "chars.json")
    BPETokenizer.train("abc abc abd", 258).save(folder / "bpe.json")
    return [folder / "chars.json", folder / "bpe.json"]


def _text_file(folder: Path) -> Path:
    path = folder / "text.txt"
    path.write_text("to be or not to be " * 20, encoding="utf-8")
    return path


# --- W16: data errors name the file -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content,tokenizer,match",
    [
        ("", "char", r"empty\.txt is empty: there is no text to learn from"),
        ("", "bpe", r"empty\.txt is empty"),
        ("a", "char", r"one\.txt gives only 1 token\(s\) with the char tokenizer"),
        ("a" * 5000, "bpe", r"aaaa\.txt gives only 1 token\(s\) with the bpe tokenizer"),
    ],
)
def test_w16_data_errors_name_the_file(cache_home, tmp_path, content, tokenizer, match):
    name = {"": "empty.txt", "a": "one.txt"}.get(content, "aaaa.txt")
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ran out of pairs": 5,000 a's make one token long before 300 ids
        with pytest.raises(ValueError, match=match) as e:
            load_token_data(tokenizer, vocab_size=300, path=path)
    assert str(path) in str(e.value)


# --- W17: the checksum error points to --data ------------------------------------------------------------------------


def test_w17_a_wrong_gptbook_data_file_points_to_data(monkeypatch, tmp_path):
    wrong = tmp_path / "mine.txt"
    wrong.write_text("my own text\n", encoding="utf-8")
    monkeypatch.setenv("GPTBOOK_DATA", str(wrong))
    with pytest.raises(ChecksumError) as e:
        tiny_shakespeare()
    message = str(e.value)
    assert f"gptbook train --data {wrong}" in message and "load_token_data(path=...)" in message
    assert "unset it" in message and "verify=False" in message
    with pytest.raises(ChecksumError) as e:  # a path given directly gets no advice about GPTBOOK_DATA
        tiny_shakespeare(wrong)
    assert "GPTBOOK_DATA" not in str(e.value) and "--data" in str(e.value)
