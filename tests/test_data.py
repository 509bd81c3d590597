"""gptbook.data: finding, verifying and downloading Tiny Shakespeare, the split, and batches as nanoGPT draws them."""

import functools
import hashlib
import http.server
import os
import pickle
import shutil
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from gptbook import data
from gptbook.tokenizer import GPT2_PATTERN, BPETokenizer, CharTokenizer
from gptbook.corpus import (
    TINY_SHAKESPEARE_SHA256,
    ChecksumError,
    cache_dir,
    download,
    tiny_shakespeare,
    tiny_shakespeare_path,
)
from gptbook.data import get_batch, load_token_data, load_tokens, save_tokens, train_val_split

SMALL = b"To be, or not to be, that is the question:\n"
SMALL_SHA = hashlib.sha256(SMALL).hexdigest()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    "A real HTTP server on 127.0.0.1 serving one small file; yields its base URL."
    root = tmp_path / "www"
    root.mkdir()
    (root / "tinyshakespeare.txt").write_bytes(SMALL)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def no_env(monkeypatch, tmp_path):
    "No GPTBOOK_DATA, and an empty private cache folder."
    monkeypatch.delenv("GPTBOOK_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gptbook"


def _dead_url():
    "A URL on 127.0.0.1 where nothing listens (bind a port, then close it)."
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/tinyshakespeare.txt"


# --- the real file -------------------------------------------------------------------------------


def test_real_text_via_env(shakespeare_path):
    text = tiny_shakespeare()
    assert len(text) == 1_115_394
    assert hashlib.sha256(text.encode()).hexdigest() == TINY_SHAKESPEARE_SHA256
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")


def test_env_may_name_a_folder(shakespeare_path, monkeypatch):
    monkeypatch.setenv("GPTBOOK_DATA", str(shakespeare_path.parent))
    assert tiny_shakespeare_path() == shakespeare_path


def test_explicit_path_wins_over_env(shakespeare_path, monkeypatch, tmp_path):
    monkeypatch.setenv("GPTBOOK_DATA", str(tmp_path / "missing.txt"))  # would be an error if consulted
    assert len(tiny_shakespeare(shakespeare_path)) == 1_115_394


def test_split_of_real_text(shakespeare):
    train, val = train_val_split(shakespeare)
    assert (len(train), len(val)) == (1_003_854, 111_540)
    assert train + val == shakespeare


# --- resolution order and errors -----------------------------------------------------------------


def test_env_pointing_nowhere_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("GPTBOOK_DATA", str(tmp_path / "nope.txt"))
    with pytest.raises(FileNotFoundError, match="GPTBOOK_DATA"):
        tiny_shakespeare()


def test_missing_explicit_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="No file at"):
        tiny_shakespeare(tmp_path / "absent.txt")


def test_wrong_file_is_caught_and_can_be_forced(tmp_path):
    p = tmp_path / "tinyshakespeare.txt"
    p.write_text("not shakespeare")
    with pytest.raises(ChecksumError, match="verify=False"):
        tiny_shakespeare(p)
    assert tiny_shakespeare(p, verify=False) == "not shakespeare"


def test_cache_dir_respects_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "gptbook"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "gptbook"


def test_cache_is_used_before_download(no_env):
    no_env.mkdir(parents=True)
    (no_env / "tinyshakespeare.txt").write_bytes(SMALL)
    # a dead URL proves no download is attempted when the cache has the file
    assert tiny_shakespeare(url=_dead_url(), sha256=SMALL_SHA) == SMALL.decode()


def test_download_into_cache_then_reuse(no_env, server):
    text = tiny_shakespeare(url=f"{server}/tinyshakespeare.txt", sha256=SMALL_SHA)
    assert text == SMALL.decode()
    assert (no_env / "tinyshakespeare.txt").read_bytes() == SMALL
    assert sorted(p.name for p in no_env.iterdir()) == ["tinyshakespeare.txt"]  # no temp files left
    assert tiny_shakespeare(url=_dead_url(), sha256=SMALL_SHA) == SMALL.decode()


def test_download_bad_checksum_writes_nothing(no_env, server):
    with pytest.raises(ChecksumError, match="SHA-256"):
        tiny_shakespeare(url=f"{server}/tinyshakespeare.txt")  # real Tiny Shakespeare checksum: mismatch
    assert not (no_env / "tinyshakespeare.txt").exists()
    assert not no_env.exists() or list(no_env.iterdir()) == []


def test_bad_checksum_keeps_existing_good_file(tmp_path, server):
    dest = tmp_path / "keep" / "tinyshakespeare.txt"
    dest.parent.mkdir()
    dest.write_bytes(b"the good copy")
    with pytest.raises(ChecksumError):
        download(f"{server}/tinyshakespeare.txt", dest, sha256="0" * 64)
    assert dest.read_bytes() == b"the good copy"
    assert [p.name for p in dest.parent.iterdir()] == ["tinyshakespeare.txt"]


def test_server_down_says_how_to_supply(no_env):
    with pytest.raises(ConnectionError) as e:
        tiny_shakespeare(url=_dead_url())
    msg = str(e.value)
    for hint in ("path=", "GPTBOOK_DATA", str(no_env / "tinyshakespeare.txt"), TINY_SHAKESPEARE_SHA256):
        assert hint in msg
    assert msg.index("GPTBOOK_DATA") < msg.index("gptbook train --data") < msg.index("path=")  # the CLI's ways first


def test_http_404_is_a_clear_error(no_env, server):
    with pytest.raises(ConnectionError, match="Could not download"):
        tiny_shakespeare(url=f"{server}/missing.txt")
    assert not (no_env / "tinyshakespeare.txt").exists()


def test_no_download_when_disabled(no_env):
    with pytest.raises(FileNotFoundError, match="GPTBOOK_DATA"):
        tiny_shakespeare(download_missing=False)


# --- split ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,n_train", [(2, 1), (3, 2), (10, 9), (11, 9), (1000, 900), (1001, 900)])
def test_split_sizes_and_order(n, n_train):
    seq = list(range(n))
    train, val = train_val_split(seq)
    assert train + val == seq
    assert len(train) == n_train  # at least one item on each side, otherwise the first 90% (rounded down)


def test_char_tokenizer_is_reexported():
    from gptbook.tokenizer import CharTokenizer

    assert data.CharTokenizer is CharTokenizer


def test_load_token_data_with_tiktoken_and_hf_tokenizers(tmp_path):
    "An Encoding or an HF tokenizer gives the ids it gives itself, through as_tokenizer (plain text, no BOS added)."
    pytest.importorskip("tiktoken")
    pytest.importorskip("tokenizers")
    from gptbook.adapters import TokenizerAdapter
    from gptbook.tokenizer import GPT2_PATTERN, BPETokenizer

    text = "First Citizen:\nBefore we proceed any further, hear me speak. 日🙂 naïve <|endoftext|>\n" * 30
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    bpe = BPETokenizer.train(text, 300, GPT2_PATTERN, special_tokens=["<|endoftext|>"])
    enc, hf = bpe.to_tiktoken(), bpe.to_hf()
    kinds = [(enc, enc.encode_ordinary(text)), (hf, hf.encode(text, add_special_tokens=False).ids)]
    try:
        from transformers import PreTrainedTokenizerFast

        kinds.append((PreTrainedTokenizerFast(tokenizer_object=hf), hf.encode(text).ids))
    except ImportError:
        pass
    for tok, want in kinds:
        d = data.load_token_data(tok, path=path, cache=False)
        assert isinstance(d.tokenizer, TokenizerAdapter) and d.vocab_size == bpe.vocab_size
        assert [*d.train.tolist(), *d.val.tolist()] == want
        assert d.tokenizer.decode(want) == text
    with pytest.raises(TypeError, match="int is not a tokenizer gptbook knows"):
        data.load_token_data(3, path=path)


# --- the BPE token cache: checked before use, and never needed -------------------------------------------------


def _cached(cache_home, text_path, vocab_size=300):
    "The cache entry of a BPE trained on the training part of `text_path` (the validation part is never learned from)."
    train_text, _ = train_val_split(text_path.read_text(encoding="utf-8"))
    name = f"bpe{vocab_size}-gpt2-{hashlib.sha256(train_text.encode()).hexdigest()[:16]}"  # GPT-2's pattern
    return cache_home / "gptbook" / "tokens" / f"{name}.json", cache_home / "gptbook" / "tokens" / f"{name}.npy"


@pytest.fixture
def small_text(tmp_path, monkeypatch, shakespeare):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "small.txt"
    path.write_text(shakespeare[:20_000], encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "damage",
    [
        lambda tok, ids, other: np.save(ids, np.arange(34, dtype=np.uint16)),  # ids of another text
        lambda tok, ids, other: ids.write_bytes(pickle.dumps(list(range(34)))),  # a pickle: never unpickled
        lambda tok, ids, other: other.save(tok),  # another tokenizer under this text's name
        lambda tok, ids, other: np.save(ids, np.zeros(5, dtype=np.float64)),  # not ids at all
    ],
)
def test_a_damaged_or_foreign_cache_entry_is_rebuilt_not_trained_on(small_text, tmp_path, damage):
    fresh = load_token_data("bpe", vocab_size=300, path=small_text)
    tok_file, ids_file = _cached(tmp_path / "cache", small_text)
    damage(tok_file, ids_file, BPETokenizer.train("something else entirely " * 50, 280))
    again = load_token_data("bpe", vocab_size=300, path=small_text)
    assert np.array_equal(np.array(again.train), np.array(fresh.train))
    assert again.tokenizer.merges == fresh.tokenizer.merges
    assert np.array_equal(np.load(ids_file), fresh.train)  # rebuilt


def test_a_bpe_learns_from_the_training_text_only(tmp_path):
    "The validation part is never learned from: its pairs get no merge, and the split is the characters' split."
    path = tmp_path / "t.txt"
    path.write_text("the cat sat " * 75 + "xyzw" * 25, encoding="utf-8")  # the last tenth: 'xyzw' only
    d = load_token_data("bpe", vocab_size=264, path=path, cache=False)  # all the pairs GPT-2's pattern leaves
    train_text, val_text = train_val_split(path.read_text(encoding="utf-8"))
    assert d.tokenizer.merges == BPETokenizer.train(train_text, 264, pattern=GPT2_PATTERN).merges
    assert not any(b"x" in t or b"y" in t for t in d.tokenizer.vocab.values() if len(t) > 1)
    assert d.tokenizer.decode(d.val.tolist()) == val_text and len(d.val) == len(val_text)


def test_bpe_splits_with_gpt2s_pattern_as_the_tokenizer_command_does(small_text, tmp_path, capsys):
    "F7: `--tokenizer bpe` learns the merges `gptbook tokenizer train` learns (GPT-2's pattern) from the training part."
    from gptbook.cli import main

    train_text, _ = train_val_split(small_text.read_text(encoding="utf-8"))
    (tmp_path / "train.txt").write_text(train_text, encoding="utf-8")
    assert main(["tokenizer", "train", tmp_path / "train.txt", "--vocab-size", 300, "--out", tmp_path / "t.json"]) == 0
    d = load_token_data("bpe", vocab_size=300, path=small_text)
    assert d.tokenizer.pattern == GPT2_PATTERN and d.tokenizer.merges == BPETokenizer.load(tmp_path / "t.json").merges


def test_a_tokenizer_file_is_a_tokenizer_with_its_special_tokens(small_text, tmp_path):
    "F8: the path of a saved tokenizer trains with it, special tokens included; a word that is neither is refused."
    tok = BPETokenizer.train(small_text.read_text(encoding="utf-8"), 300, GPT2_PATTERN, ["<|endoftext|>"])
    tok.save(tmp_path / "tok.json")
    for given in (tmp_path / "tok.json", str(tmp_path / "tok.json")):
        d = load_token_data(given, path=small_text)
        assert d.tokenizer.special_tokens == {"<|endoftext|>": 299} and d.tokenizer.merges == tok.merges
        assert d.tokenizer.decode(d.val.tolist()) == train_val_split(small_text.read_text(encoding="utf-8"))[1]
    with pytest.raises(ValueError, match="tokenizer='words' is neither 'char', 'bpe' nor a tokenizer file"):
        load_token_data("words", path=small_text)


def test_ids_past_65536_are_stored_as_uint32(tmp_path):
    "F15: a vocabulary of 100,000 ids (cl100k_base's size, cheaply: characters) trains on uint32 ids, saved and read."
    chars = [chr(0x10000 + i) for i in range(100_000)]  # past the BMP: no surrogates
    CharTokenizer(chars).save(tmp_path / "wide.json")
    text = "".join(chars[i] for i in np.random.default_rng(0).integers(0, 100_000, 500))
    (tmp_path / "wide.txt").write_text(text, encoding="utf-8")
    d = load_token_data(tmp_path / "wide.json", path=tmp_path / "wide.txt")
    assert d.vocab_size == 100_000 and d.train.dtype == np.uint32 and d.tokenizer.decode(d.train) == text[:450]
    ids = np.concatenate([d.train, d.val])
    path = save_tokens(ids, tmp_path / "wide.bin", vocab_size=d.vocab_size)
    assert path.stat().st_size == 4 * 500 and (load_tokens(path, vocab_size=d.vocab_size) == ids).all()
    assert load_tokens(save_tokens(ids[:3] % 2**16, tmp_path / "narrow.bin"), 2**16).dtype == np.uint16  # nanoGPT's
    with pytest.raises(ValueError, match=r"ids must lie in 0..65,535 to be stored as uint16"):
        save_tokens(ids, tmp_path / "x.bin")


def test_another_texts_entry_under_this_name_is_caught(small_text, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text(small_text.read_text()[::-1], encoding="utf-8")
    mine = load_token_data("bpe", vocab_size=300, path=small_text)
    load_token_data("bpe", vocab_size=300, path=other)
    for ours, theirs in zip(_cached(tmp_path / "cache", small_text), _cached(tmp_path / "cache", other)):
        shutil.copy(theirs, ours)  # a complete, self-consistent entry, of another text
    again = load_token_data("bpe", vocab_size=300, path=small_text)
    assert np.array_equal(np.array(again.train), np.array(mine.train))


# ---------------------------------------------------------------------- bad data: one line naming the file


@pytest.fixture
def cache_home(monkeypatch, tmp_path):
    "A private, empty $XDG_CACHE_HOME; returns the token cache folder in it."
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gptbook" / "tokens"


def test_a_data_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Où est la café?".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8 text \(byte 0xf9 at position 1\): convert it"):
        load_token_data("char", path=path)
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes([0xA9, 0x00, 0xFF]) * 10)
    with pytest.raises(ValueError, match=r"binary\.bin is not UTF-8 text \(byte 0xa9 at position 0\)"):
        load_token_data("bpe", vocab_size=300, path=binary, cache=False)


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_what_the_data_modules_write_follows_the_umask(cache_home, tmp_path, umask):
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


@pytest.mark.parametrize(
    "content,tokenizer,match",
    [
        ("", "char", r"empty\.txt is empty: there is no text to learn from"),
        ("", "bpe", r"empty\.txt is empty"),
        ("a", "char", r"one\.txt gives only 1 token\(s\) with the char tokenizer"),
        ("a", "bpe", r"one\.txt gives only 1 token\(s\) with the bpe tokenizer"),
    ],
)
def test_empty_or_one_token_data_is_named(cache_home, tmp_path, content, tokenizer, match):
    name = {"": "empty.txt", "a": "one.txt"}[content]
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ran out of pairs": one character has no pair to merge
        with pytest.raises(ValueError, match=match) as e:
            load_token_data(tokenizer, vocab_size=300, path=path)
    assert str(path) in str(e.value)


def test_a_wrong_gptbook_data_file_points_to_data(monkeypatch, tmp_path):
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


def test_get_batch_draws_nanogpts_batches():
    "nanoGPT's get_batch (train.py's lines, given our generator) draws the same x and y, batch after batch."
    data = np.random.default_rng(0).integers(0, 65, 5_000).astype(np.uint16)
    block_size, batch_size = 64, 12
    ours, theirs = torch.Generator().manual_seed(1337), torch.Generator().manual_seed(1337)
    for _ in range(5):
        ix = torch.randint(len(data) - block_size, (batch_size,), generator=theirs)
        x = torch.stack([torch.from_numpy((data[i : i + block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix])
        got_x, got_y = get_batch(data, batch_size, block_size, ours)
        assert torch.equal(got_x, x) and torch.equal(got_y, y)
