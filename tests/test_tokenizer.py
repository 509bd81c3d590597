"""gptbook.tokenizer against independent references: the naive loop for the fast trainer's merges,
tiktoken and HF tokenizers for the ids, plus round trips, the file format and the error messages."""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import regex
from hypothesis import given, settings, strategies as st

from gptbook.tokenizer import (
    GPT2_PATTERN,
    BPETokenizer,
    CharTokenizer,
    apply_merges,
    bpe_merges,
    load_tokenizer,
    merge_pair,
    pretokenize,
    train_bpe_naive,
)

from gptbook.adapters import TokenizerAdapter, as_tokenizer, byte_to_char

ROOT = Path(__file__).resolve().parents[1]
tiktoken = pytest.importorskip("tiktoken")
tokenizers = pytest.importorskip("tokenizers")

# Texts where overlap counting matters (runs of one character) mixed with arbitrary Unicode.
pieces = st.sampled_from(["a", "aa", "aaa", "b", "ab", " ", "  ", "\n", "\r\n", "é", "🙂", "'s", "1", "语"])
runs = st.lists(pieces, min_size=1, max_size=40).map("".join)
texts = st.one_of(st.text(min_size=1, max_size=80), runs)
EOT = "<|endoftext|>"
AWKWARD = [
    "",
    " ",
    "a",
    "hello world!!!? (안녕하세요!) lol123 😉",
    "naïve café",
    "e\u0301\u0301 a\u0308",
    "语言模型 トークン",
    "a\r\nb\r\n\r\n",
    " " * 17 + "x",
    "x" + " " * 9,
    "1234567890 3.14159 007",
    "\t\n \u00a0\u2028\u3000",
    "ÿ\x00\x7f\x1b",
    "🙂🙂🙂👍🏽👨‍👩‍👧",
    "'s 're 'll 'S",
    "aaaaaaaaaaaaaaaaaaaaaaaaa",
]


def train_quiet(*args, **kwargs):
    "BPETokenizer.train without the 'ran out of pairs' warning that tiny hypothesis texts trigger."
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BPETokenizer.train(*args, **kwargs)


# ---------------------------------------------------------------- fast trainer == naive loop


@settings(max_examples=50, deadline=None)
@given(texts, st.integers(256, 330))
def test_fast_merges_equal_naive_without_pattern(s, vocab_size):
    tok = train_quiet(s, vocab_size)
    assert list(tok.merges.items()) == list(train_bpe_naive(s, vocab_size).items())


@settings(max_examples=50, deadline=None)
@given(texts, st.integers(256, 330))
def test_fast_merges_equal_naive_per_chunk_with_pattern(s, vocab_size):
    tok = train_quiet(s, vocab_size, pattern=GPT2_PATTERN)
    chunks = regex.findall(GPT2_PATTERN, s)  # the reference splits with the regex module directly
    assert list(tok.merges.items()) == list(train_bpe_naive(chunks, vocab_size).items())


@pytest.mark.parametrize("s", ["aaaa", "aaaaaaa", "aaa aaaa aaaaa", "abababa", "aabaabaab", "a" * 50 + "b" * 49])
def test_overlapping_runs(s):
    for vocab_size in range(257, 268):
        assert list(train_quiet(s, vocab_size).merges.items()) == list(train_bpe_naive(s, vocab_size).items())


def test_merge_counts_are_tokens_saved():
    # "aaaaaaa": (a, a) counts 6 (zip overlaps) but merges 3 times; then (256, 256) counts 2, merges once.
    assert bpe_merges([(b"aaaaaaa", 1)], 2) == ([(97, 97), (256, 256)], [3, 1])
    assert bpe_merges({b"aaa": 10, b"ab": 1}, 1) == ([(97, 97)], [10])


@pytest.mark.parametrize("pattern", [None, GPT2_PATTERN])
def test_20kb_slice_vocab_400(shakespeare, pattern):
    s = shakespeare[:20_000]
    tok = BPETokenizer.train(s, 400, pattern=pattern)
    reference = train_bpe_naive(s if pattern is None else regex.findall(pattern, s), 400)
    assert len(reference) == 144
    assert list(tok.merges.items()) == list(reference.items())


def test_golden_shakespeare_gpt2_pattern(shakespeare):
    # Fixed expectations: a change of tie-break or of counting would show here.
    tok = BPETokenizer.train(shakespeare, 10_000, pattern=GPT2_PATTERN)
    assert list(tok.merges)[:8] == [
        (32, 116),
        (104, 101),
        (32, 97),
        (111, 117),
        (32, 115),
        (32, 109),
        (105, 110),
        (32, 119),
    ]
    ids = tok.encode(shakespeare)
    assert len(ids) == 312_072  # 3.57 bytes per token
    assert len(ids) == len(shakespeare.encode()) - sum(tok.merge_counts)  # encoding replays training


@pytest.mark.slow
def test_shakespeare_compression_without_pretokenization(shakespeare):
    tok = BPETokenizer.train(shakespeare, 10_000)
    n = len(shakespeare.encode())
    assert round(n / (n - sum(tok.merge_counts[:744])), 2) == 2.49
    assert round(n / (n - sum(tok.merge_counts)), 2) == 4.72
    assert len(tok.encode(shakespeare)) == n - sum(tok.merge_counts)


# ---------------------------------------------------------------- pre-tokenization and encoding


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(alphabet=st.characters(max_codepoint=127), max_size=60), runs.filter(str.isascii)))
def test_ascii_twin_of_gpt2_pattern_agrees_with_regex(s):
    # pretokenize runs ASCII text through a `re` spelling of the pattern; the reference is `regex` itself.
    assert pretokenize(s) == regex.findall(GPT2_PATTERN, s)
    assert pretokenize(s + "é") == regex.findall(GPT2_PATTERN, s + "é")  # non-ASCII: the regex path


def test_pretokenize_gpt2_on_shakespeare(shakespeare):
    assert pretokenize(shakespeare) == regex.findall(GPT2_PATTERN, shakespeare)


@settings(max_examples=30, deadline=None)
@given(st.one_of(st.binary(min_size=41, max_size=300), runs.map(str.encode)))
def test_apply_merges_long_and_short_paths_equal_replay(raw_tok, b):
    # The reference replays every merge in order with merge_pair, the seed's definition of encoding.
    merges = raw_tok.merges
    replay = list(b)
    for pair, new_id in merges.items():
        replay = merge_pair(replay, pair, new_id)
    assert apply_merges(b, merges) == replay
    pieces = [b[i : i + 40] for i in range(0, len(b), 40)]  # short path, per piece
    short = []
    for p in pieces:
        r = list(p)
        for pair, new_id in merges.items():
            r = merge_pair(r, pair, new_id)
        short += r
    assert [x for p in pieces for x in apply_merges(p, merges)] == short


def test_every_token_encodes_to_itself(tok, raw_tok):
    for t in (tok, raw_tok):
        n = 256 + len(t.merges)
        assert [i for i in range(n) if apply_merges(t.vocab[i], t.merges) != [i]] == []
        assert len({t.vocab[i] for i in range(n)}) == n


@settings(max_examples=50, deadline=None)
@given(texts)
def test_round_trip(tok, raw_tok, s):
    for t in (tok, raw_tok):
        ids = t.encode(s)
        assert t.decode(ids) == s
        assert t.decode_bytes(ids) == s.encode("utf-8")


def test_decode_accepts_numpy_and_torch_ids(tok):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    ids = tok.encode("To be, or not to be")
    assert tok.decode(np.array(ids, dtype=np.uint16)) == tok.decode(torch.tensor(ids)) == "To be, or not to be"


def test_partial_utf8_token_decodes_with_replacement(tok):
    ids = tok.encode("🙂")
    assert ids == list("🙂".encode())  # never merged in Shakespeare: four byte tokens
    assert tok.decode(ids[:2]) == "\ufffd" and tok.decode_bytes(ids[:2]) == b"\xf0\x9f"


def test_leading_space_is_part_of_the_token(tok):
    assert tok.encode(" the") != tok.encode("the") and len(tok.encode(" the")) == 1


# ---------------------------------------------------------------- tiktoken and HF tokenizers give the same ids


@pytest.fixture(scope="module")
def split(shakespeare):
    from gptbook.data import train_val_split

    return train_val_split(shakespeare)


@pytest.fixture(scope="module")
def tok(split):
    return BPETokenizer.train(split[0], 10_000, pattern=GPT2_PATTERN, special_tokens=[EOT])


@pytest.fixture(scope="module")
def raw_tok(split):
    return BPETokenizer.train(split[0][:100_000], 1_000)  # no pre-tokenization


def test_tiktoken_and_hf_ids_on_validation_split(tok, split):
    val = split[1]
    ours = tok.encode(val)
    assert tok.to_tiktoken().encode_ordinary(val) == ours
    assert tok.to_hf().encode(val).ids == ours
    assert len(ours) < len(val) / 3  # sanity: a real compression, not bytes


def test_tiktoken_and_hf_ids_without_pretokenization(raw_tok, split):
    val = split[1][:20_000]  # one chunk: keep it short for tiktoken's per-chunk merge loop
    ours = raw_tok.encode(val)
    assert raw_tok.to_tiktoken().encode_ordinary(val) == ours
    assert raw_tok.to_hf().encode(val).ids == ours


@pytest.fixture(scope="module")
def converted(tok, raw_tok):
    "Each tokenizer with its tiktoken and HF twins, built once."
    return [(t, t.to_tiktoken(), t.to_hf()) for t in (tok, raw_tok)]


@pytest.mark.parametrize("s", AWKWARD)
def test_tiktoken_and_hf_ids_on_awkward_strings(converted, s):
    for t, tt, hf in converted:
        ours = t.encode(s)
        assert tt.encode_ordinary(s) == ours
        assert hf.encode(s).ids == ours
        assert t.decode(ours) == s
        assert hf.decode(ours) == s


@settings(max_examples=100, deadline=None)
@given(texts, st.integers(0, 10**9), st.integers(0, 300))
def test_tiktoken_and_hf_ids_on_random_text(converted, split, s, start, length):
    """tiktoken joins the adjacent pair whose joined bytes rank lowest; we apply the merge with the lowest id.
    Different rules, whose agreement chapter 1 checks rather than proves: on random text, and on random windows
    of the validation split (where many merges apply) with the random text spliced on."""
    val = split[1]
    i = start % len(val)
    for text in (s, val[i : i + length] + s):
        for t, tt, hf in converted:
            ours = t.encode(text)
            assert tt.encode_ordinary(text) == ours
            assert hf.encode(text).ids == ours


def test_special_tokens_follow_tiktoken(tok):
    tt = tok.to_tiktoken()
    s = f"Speak.{EOT}ROMEO:{EOT}"
    assert tok.vocab_size == 10_000 and tok.special_tokens == {EOT: 9_999}
    assert tok.encode(s, allowed_special="all") == tt.encode(s, allowed_special="all")
    assert tok.encode(s, allowed_special={EOT}).count(9_999) == 2
    assert tok.encode(s, disallowed_special=()) == tt.encode(s, disallowed_special=()) == tok.encode_ordinary(s)
    assert 9_999 not in tok.encode_ordinary(s)
    with pytest.raises(ValueError, match="special token"):
        tt.encode(s)  # tiktoken refuses too
    with pytest.raises(ValueError, match=r"special token '<\|endoftext\|>' at position 6"):
        tok.encode(s)
    with pytest.raises(ValueError, match="special token"):  # a name that is no special token allows nothing
        tok.encode(s, allowed_special={"<|pad|>"})
    assert tok.decode(tok.encode(s, allowed_special="all")) == s
    assert tok.to_hf().encode(s).ids == tok.encode(s, allowed_special="all")


# ---------------------------------------------------------------- save / load


def test_save_load_round_trip(tok, split, tmp_path):
    tok.save(tmp_path / "tok.json")
    d = json.loads((tmp_path / "tok.json").read_text(encoding="utf-8"))  # plain JSON, readable
    assert d["type"] == "bpe" and d["version"] == 1 and d["pattern"] == GPT2_PATTERN
    assert d["special_tokens"] == {EOT: 9_999} and d["merges"][0] == [32, 116, " t"]
    back = BPETokenizer.load(tmp_path / "tok.json")
    assert back.merges == tok.merges and list(back.merges) == list(tok.merges)
    assert back.vocab == tok.vocab and back.pattern == tok.pattern and back.special_tokens == tok.special_tokens
    sample = split[1][:5000] + EOT
    assert back.encode(sample, allowed_special="all") == tok.encode(sample, allowed_special="all")


def test_save_load_without_pattern(raw_tok, tmp_path):
    raw_tok.save(tmp_path / "raw.json")
    back = BPETokenizer.load(tmp_path / "raw.json")
    assert back.pattern is None and list(back.merges.items()) == list(raw_tok.merges.items())
    assert back.encode(AWKWARD[3]) == raw_tok.encode(AWKWARD[3])


def test_load_errors(tok, tmp_path):
    CharTokenizer.train("abc").save(tmp_path / "char.json")
    with pytest.raises(ValueError, match="use CharTokenizer.load"):
        BPETokenizer.load(tmp_path / "char.json")
    tok.save(tmp_path / "tok.json")
    d = json.loads((tmp_path / "tok.json").read_text(encoding="utf-8"))
    d["merges"][5][2] = "zz"
    (tmp_path / "edited.json").write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(ValueError, match="merge 5"):
        BPETokenizer.load(tmp_path / "edited.json")
    d["merges"][5][2], d["merges"][5][0] = "anything", 9_000  # refers to an id that does not exist yet
    (tmp_path / "edited.json").write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(ValueError, match="existing ids"):
        BPETokenizer.load(tmp_path / "edited.json")
    d = dict(type="bpe", version=2, merges=[])
    (tmp_path / "v2.json").write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(ValueError, match="version"):
        BPETokenizer.load(tmp_path / "v2.json")


def test_load_tokenizer_dispatches_on_type(tok, tmp_path):
    tok.save(tmp_path / "bpe.json")
    CharTokenizer.train("hello").save(tmp_path / "char.json")
    back = load_tokenizer(tmp_path / "bpe.json")
    assert type(back) is BPETokenizer and list(back.merges.items()) == list(tok.merges.items())
    assert back.special_tokens == tok.special_tokens and back.pattern == tok.pattern
    char = load_tokenizer(tmp_path / "char.json")
    assert type(char) is CharTokenizer and char.chars == ["e", "h", "l", "o"]


def test_a_file_without_type_is_refused_naming_it(tok, tmp_path):
    'No release wrote a tokenizer file without its "type": such a file is one line, not a guess from its keys.'
    (tmp_path / "char.json").write_text(json.dumps({"chars": ["a", "b"]}), encoding="utf-8")
    tok.save(tmp_path / "tok.json")
    d = json.loads((tmp_path / "tok.json").read_text(encoding="utf-8"))
    del d["type"]
    (tmp_path / "old.json").write_text(json.dumps(d), encoding="utf-8")
    for name in ("char.json", "old.json"):
        for load in (load_tokenizer, CharTokenizer.load, BPETokenizer.load):
            with pytest.raises(ValueError, match=r'its "type" is None') as e:
                load(tmp_path / name)
            assert str(e.value).startswith(str(tmp_path / name)) and "\n" not in str(e.value)


def test_load_tokenizer_errors(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"type": "wordpiece", "vocab": {}}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"its \"type\" is 'wordpiece', expected \"char\" or \"bpe\""):
        load_tokenizer(tmp_path / "other.json")
    (tmp_path / "odd.json").write_text(json.dumps({"type": ["bpe"]}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"its \"type\" is \['bpe'\]"):
        load_tokenizer(tmp_path / "odd.json")
    (tmp_path / "list.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match="not a gptbook tokenizer file"):
        load_tokenizer(tmp_path / "list.json")
    (tmp_path / "cut.json").write_text('{"type": "bpe", "merges": [[32, 1', encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_tokenizer(tmp_path / "cut.json")
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing.json")


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "tok.json"
    BPETokenizer.train("hello hello", 258).save(path)
    before = path.read_text(encoding="utf-8")
    tok = BPETokenizer.train("abcabcabc", 259)

    def fsync_fails(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync_fails)  # the new file is written, then cannot be made durable
    with pytest.raises(OSError, match="No space left"):
        tok.save(path)
    monkeypatch.undo()
    assert path.read_text(encoding="utf-8") == before  # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["tok.json"]  # and no temporary file left behind
    tok.save(tmp_path / "sub" / "tok.json")  # the folder is created
    assert BPETokenizer.load(tmp_path / "sub" / "tok.json").merges == tok.merges


def test_save_load_without_merges(tmp_path):
    tok = BPETokenizer([], special_tokens=[EOT])
    tok.save(tmp_path / "empty.json")
    back = load_tokenizer(tmp_path / "empty.json")
    assert back.merges == {} and back.special_tokens == {EOT: 256} and back.vocab_size == 257


def test_bounded_chunk_cache_gives_the_same_ids(tok, split):
    small = BPETokenizer(tok.merges, tok.pattern, tok.special_tokens)
    small.cache_limit = 5_000  # below the 10,000 tokens the cache starts with: it is renewed at every call
    sample = split[1][:20_000]
    caches = []
    for _ in range(2):
        assert small.encode(sample) == tok.encode(sample)
        caches.append(small._cache)
    assert caches[0] is not caches[1]
    assert len(small._cache) <= tok.vocab_size + len(set(pretokenize(sample)))


# ---------------------------------------------------------------- errors


def test_training_errors():
    with pytest.raises(ValueError, match="at least 256"):
        BPETokenizer.train("hello", 255)
    with pytest.raises(ValueError, match="at least 257"):
        BPETokenizer.train("hello", 256, special_tokens=[EOT])
    with pytest.warns(UserWarning, match="ran out of pairs after 0 merges"):  # an empty text: the 256 bytes only
        assert BPETokenizer.train("", 300).vocab_size == 256
    with pytest.raises(TypeError, match=r"expects a str, got bytes; decode it first"):
        BPETokenizer.train(b"hello", 300)
    with pytest.raises(ValueError, match="lone surrogate"):
        BPETokenizer.train("a\ud800b", 300)
    with pytest.raises(ValueError, match="does not match"):
        BPETokenizer.train("ab cd", 300, pattern=r"\w+")
    with pytest.raises(ValueError, match="at least 256"):
        train_bpe_naive("hello", 10)
    with pytest.warns(UserWarning, match="ran out of pairs"):
        BPETokenizer.train("abc", 300)


def test_encode_decode_errors(tok):
    with pytest.raises(TypeError, match="expects a str"):
        tok.encode(b"bytes")
    with pytest.raises(TypeError, match="expects a str"):
        tok.encode_ordinary(None)
    with pytest.raises(ValueError, match="position 2"):
        tok.encode("ab\udc80")
    with pytest.raises(ValueError, match="id 10000 is not in"):
        tok.decode([1, 10_000])
    with pytest.raises(ValueError, match="id -1 is not in"):
        tok.decode([-1])
    with pytest.raises(TypeError, match=r"decode\(\[id\]\)"):
        tok.decode(5)
    with pytest.raises(TypeError):
        tok.decode(["a"])
    with pytest.raises(ValueError, match="does not match"):
        pretokenize("ab cd", r"\w+")


# ---------------------------------------------------------------- characters


def test_char_tokenizer(tmp_path):
    ct = CharTokenizer.train("hello world")
    assert ct.chars == sorted(set("hello world")) and ct.vocab_size == 8
    assert ct.decode(ct.encode("hello")) == "hello"
    ct.save(tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text(encoding="utf-8")) == {"type": "char", "chars": ct.chars}
    assert CharTokenizer.load(tmp_path / "c.json").chars == ct.chars
    with pytest.raises(ValueError, match="'z' at position 3"):
        ct.encode("helz")
    with pytest.raises(ValueError, match="not a valid"):
        ct.decode([8])
    with pytest.raises(ValueError, match="at least one character"):
        CharTokenizer.train("")
    with pytest.raises(TypeError, match="str"):
        CharTokenizer.train(["a"])
    BPETokenizer.train("abcabc", 257).save(tmp_path / "b.json")
    with pytest.raises(ValueError, match="use BPETokenizer.load"):
        CharTokenizer.load(tmp_path / "b.json")


def test_decode_zero_dim_ids_says_use_a_list():
    import numpy as np
    import torch

    tok = BPETokenizer.train("hello hello world", 260)
    for one_id in (np.int64(104), torch.tensor(104)):
        with pytest.raises(TypeError, match=r"decode\(\[id\]\)"):
            tok.decode(one_id)
    assert tok.decode(np.array([104, 105])) == "hi"


# ---- tokenizers in: from_hf and from_tiktoken ----------------------------------------------------------------------
AWKWARD_IN = [*AWKWARD, "日🙂 naïve", "𝕏𝔸 \U00010348 \U0001f9d1\u200d\U0001f52c", "it's I'LL we've   \n\n\t  end  "]
CL100K_LIKE = (  # tiktoken's cl100k_base pattern: case-insensitive contractions, digits in threes, possessive runs
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)


def hf_trained(text, vocab_size, split_pattern=None):
    "A byte-level BPE trained by HF `tokenizers` itself (special tokens first, then bytes in its own order)."
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split_pattern is None)
    split = [] if split_pattern is None else [pre_tokenizers.Split(Regex(split_pattern), behavior="isolated")]
    hf.pre_tokenizer = pre_tokenizers.Sequence([*split, byte_level]) if split else byte_level
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT, "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator([text], trainer)
    return hf


@pytest.fixture(scope="module", params=[None, CL100K_LIKE], ids=["bytelevel-regex", "split-cl100k"])
def hf_pair(request, split, tmp_path_factory):
    "(HF tokenizer trained by `tokenizers`, BPETokenizer.from_hf of its saved tokenizer.json folder)."
    hf = hf_trained(split[0], 3_000, request.param)
    folder = tmp_path_factory.mktemp("hf")
    hf.save(str(folder / "tokenizer.json"))
    return hf, BPETokenizer.from_hf(folder)


def test_from_hf_ids_equal_tokenizers(hf_pair, split):
    hf, tok = hf_pair
    assert tok.vocab_size == hf.get_vocab_size() == 3_000
    assert tok.ids is not None and tok.ids[:2] != [0, 1]  # its own numbering: specials first, bytes in HF's order
    for s in [*AWKWARD_IN, split[1]]:
        ids = tok.encode(s)
        assert ids == hf.encode(s).ids, s[:40]
        assert tok.decode(ids) == s == hf.decode(ids)
    text = f"<pad>a{EOT}b"
    assert tok.encode(text, allowed_special="all") == hf.encode(text).ids


def test_from_hf_saves_and_loads_with_its_numbering(hf_pair, split, tmp_path):
    _, tok = hf_pair
    tok.save(tmp_path / "t.json")
    back = load_tokenizer(tmp_path / "t.json")
    assert back.ids == tok.ids and back.vocab == tok.vocab and back.special_tokens == tok.special_tokens
    assert back.encode(split[1]) == tok.encode(split[1])


def test_from_hf_inverts_to_hf(tok, raw_tok, tmp_path):
    for t in (tok, raw_tok):
        t.to_hf().save(str(tmp_path / "tokenizer.json"))
        back = BPETokenizer.from_hf(tmp_path / "tokenizer.json")
        assert (back.merges, back.pattern, back.special_tokens) == (t.merges, t.pattern, t.special_tokens)
        assert back.ids is None  # the book's own numbering comes back as it was


def test_from_hf_refuses_other_kinds(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    cases = {
        "wordpiece": (Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")), "is a WordPiece tokenizer"),
        "unigram": (Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0)), "is a Unigram tokenizer"),
        "bpe": (Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")])), "BPE tokenizer that is not byte-level"),
    }
    cases["bpe"][0].pre_tokenizer = pre_tokenizers.Whitespace()
    for name, (hf, message) in cases.items():
        hf.save(str(tmp_path / f"{name}.json"))
        with pytest.raises(ValueError, match=message) as e:
            BPETokenizer.from_hf(tmp_path / f"{name}.json")
        assert "\n" not in str(e.value) and "GPT-2-style byte-level BPE" in str(e.value)
    with pytest.raises(FileNotFoundError, match="from_hf wants a tokenizer.json or a folder with one"):
        BPETokenizer.from_hf(tmp_path / "nowhere")


def test_from_tiktoken_inverts_to_tiktoken(tok, raw_tok):
    for t in (tok, raw_tok):
        back = BPETokenizer.from_tiktoken(t.to_tiktoken())
        assert (back.merges, back.pattern, back.special_tokens) == (t.merges, t.pattern, t.special_tokens)
        assert back.ids is None  # the book's own numbering comes back as it was


def test_from_tiktoken_ids_equal_an_encoding_with_its_own_numbering(split):
    "An Encoding whose byte ranks are not the byte values (as GPT-2's are not) and with the cl100k pattern."
    hf = hf_trained(split[0], 2_000, CL100K_LIKE)
    vocab = hf.get_vocab()
    as_byte = {c: b for b, c in zip(range(256), pretokenize_alphabet())}
    ranks = {bytes(as_byte[c] for c in s): i for s, i in vocab.items() if s not in (EOT, "<pad>")}
    enc = tiktoken.Encoding("hf-trained", pat_str=CL100K_LIKE, mergeable_ranks=ranks, special_tokens={EOT: 0})
    tok = BPETokenizer.from_tiktoken(enc)
    assert tok.pattern == CL100K_LIKE and tok.special_tokens == {EOT: 0}
    for s in [*AWKWARD_IN, split[1]]:
        assert tok.encode(s) == enc.encode_ordinary(s) == hf.encode(s).ids, s[:40]
    assert tok.encode(f"a{EOT}", allowed_special="all") == enc.encode(f"a{EOT}", allowed_special="all")
    with pytest.raises(TypeError, match="from_tiktoken expects a tiktoken.Encoding, got str"):
        BPETokenizer.from_tiktoken("gpt2")


def pretokenize_alphabet():
    "GPT-2's character for each byte, in byte order."
    table = byte_to_char()
    return [table[b] for b in range(256)]


def test_gpt2_encoder_spelling_of_the_pattern_is_gpt2_pattern():
    "tiktoken's \"gpt2\" and HF's ByteLevel spell GPT-2's pattern as encoder.py did: read as GPT2_PATTERN, fast path."
    original = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    tok = BPETokenizer.train("It's 42 o'clock, ROMEO!\n" * 50, 270, pattern=GPT2_PATTERN)
    enc = tiktoken.Encoding(
        "orig", pat_str=original, mergeable_ranks=tok.to_tiktoken()._mergeable_ranks, special_tokens={}
    )
    back = BPETokenizer.from_tiktoken(enc)
    assert back.pattern == GPT2_PATTERN and "pattern=GPT2_PATTERN" in repr(back)
    assert back.encode("We'll see, ROMEO  42!") == enc.encode_ordinary("We'll see, ROMEO  42!")


# ---------------------------------------------------------------- files from elsewhere: one line naming the file


def write(path: Path, content) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


@pytest.mark.parametrize(
    "contents",
    [
        {"type": "char"},  # KeyError 'chars' once
        {"type": "char", "chars": None},
        {"type": "char", "chars": [1, 2]},
        {"type": "char", "chars": ["a", "a"]},
        {"type": "bpe"},  # KeyError 'merges' once
        {"type": "bpe", "merges": 5},
        {"type": "bpe", "merges": [5]},
        {"type": "bpe", "merges": [[1, 2, 3]]},
        {"type": "bpe", "merges": [], "special_tokens": 5},
        {"type": "bpe", "merges": [], "special_tokens": {"<x>": 3}},  # the id of a byte
        {"type": "bpe", "merges": [], "ids": [1, 2, 3]},
        {"type": "bpe", "merges": [], "pattern": 5},
    ],
)
def test_a_tokenizer_file_with_a_bad_field_is_one_line_naming_it(tmp_path, contents):
    path = write(tmp_path / "tokenizer.json", contents)
    with pytest.raises(ValueError) as e:
        load_tokenizer(path)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


@pytest.mark.parametrize("loader", [load_tokenizer, CharTokenizer.load, BPETokenizer.load])
def test_a_tokenizer_file_not_utf8_or_not_json_is_one_line_naming_it(tmp_path, loader):
    latin1 = write(tmp_path / "latin1.json", '{"type": "char", "chars": ["é"]}'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.json is not UTF-8 text \(byte 0xe9 at position 28\)"):
        loader(latin1)
    torn = write(tmp_path / "torn.json", b'{"type": "char", "chars": ["a", ')
    with pytest.raises(ValueError, match=r"torn\.json is not valid JSON"):
        loader(torn)


_HOSTILE = r"(a|aa)+$|[\s\S]"  # exponential backtracking on "a" * 40 + "!"


def _in_child(script: str, timeout=60, memory_gb=None) -> subprocess.CompletedProcess:
    "Run `script` in a fresh interpreter (optionally with its address space capped), so a hang or a blow-up fails."
    if memory_gb:
        script = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({memory_gb << 30},) * 2)\n" + script
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child ran over {timeout} s")


def test_a_hostile_pattern_from_a_file_cannot_hang_encode(tmp_path):
    path = write(tmp_path / "tokenizer.json", {"type": "bpe", "version": 1, "pattern": _HOSTILE, "merges": []})
    out = _in_child(
        textwrap.dedent(f"""
        import time
        from gptbook.tokenizer import load_tokenizer
        tok, t0 = load_tokenizer({str(path)!r}), time.perf_counter()
        try:
            tok.encode("a" * 40 + "!")
            print("encoded")
        except ValueError as e:
            print("ValueError", round(time.perf_counter() - t0, 1), e)
        """)
    )
    assert out.stdout.startswith("ValueError"), out.stdout + out.stderr
    assert "ReDoS" in out.stdout and float(out.stdout.split()[1]) < 10


def test_a_custom_pattern_still_works_under_the_time_limit():
    text = "It's 42 o'clock, ROMEO!\n" * 200
    tok = BPETokenizer.train(text, 262, pattern=r"\w+|\s+|[^\w\s]+")
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("pattern,exc,match", [("(a", ValueError, "is not a valid regex"), (5, TypeError, "pattern")])
def test_a_bad_pattern_is_named_with_its_file(tmp_path, pattern, exc, match):
    path = write(tmp_path / "tokenizer.json", {"type": "bpe", "pattern": pattern, "merges": []})
    with pytest.raises(ValueError, match=match) as e:  # a damaged file is a ValueError, whatever is wrong in it
        load_tokenizer(path)
    assert str(e.value).startswith(str(path))
    with pytest.raises(exc, match=match):
        BPETokenizer.train("ab cd", 260, pattern=pattern)


BOMBS = [r"(?:a{60000}){60000}|[\s\S]", r"[\s\S]{1000000000}|[\s\S]", "(?:" * 5 + "a" + "){99}" * 5 + r"|[\s\S]"]


def test_a_pattern_too_big_to_compile_is_refused_before_compiling(tmp_path):
    "The report's patterns took over 5 GB, then a MemoryError; capped at 1 GB, each is now one line, at once."
    files = [
        write(tmp_path / f"bomb{i}.json", {"type": "bpe", "pattern": p, "merges": []}) for i, p in enumerate(BOMBS)
    ]
    out = _in_child(
        textwrap.dedent(f"""
        import time
        from gptbook.tokenizer import BPETokenizer, load_tokenizer
        for path in {[str(f) for f in files]!r}:
            t0 = time.perf_counter()
            try:
                load_tokenizer(path)
            except ValueError as e:
                print(round(time.perf_counter() - t0, 1), str(e).startswith(path), "counted repeats" in str(e))
        """),
        memory_gb=1,
    )
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout + out.stderr
    for line in lines:
        seconds, names_file, says_why = line.split()
        assert float(seconds) < 5 and names_file == says_why == "True", line
    with pytest.raises(ValueError, match="counted repeats that could build"):
        BPETokenizer.train("ab", 257, pattern=BOMBS[0])


@pytest.mark.parametrize("pattern", [r"\p{L}{0,65535}\p{L}{0,65535}|[\s\S]", CL100K_LIKE, r"\d{1,3}|\D+"])
def test_patterns_with_small_or_open_counts_still_compile(pattern):
    tok = BPETokenizer([], pattern)
    assert tok.decode(tok.encode("abc 1234 déjà")) == "abc 1234 déjà"


def test_the_tokenizer_imports_no_torch_and_adapters_import_no_gptbook():
    out = _in_child(
        "import sys, gptbook.tokenizer; print('torch' in sys.modules)\n"
        "import gptbook.adapters; print(sorted(m for m in sys.modules if m.startswith('gptbook.')))"
    )
    assert out.stdout.split("\n")[0] == "False", out.stderr
    assert out.stdout.split("\n")[1] == "['gptbook.adapters', 'gptbook.files', 'gptbook.tokenizer']"
    out = _in_child("import sys, gptbook.adapters; print(sorted(m for m in sys.modules if m.startswith('gptbook')))")
    assert out.stdout.strip() == "['gptbook', 'gptbook.adapters']", out.stdout + out.stderr


@pytest.mark.parametrize("bad", [[1.0], [True], [104, 2.0]])
def test_decode_refuses_floats_and_bools(bad):
    with pytest.raises(TypeError, match="token ids must be integers, got"):
        BPETokenizer.train("hello world", 260).decode(bad)  # on the fast path, [1.0] and [True] once decoded as 1
    with pytest.raises(TypeError, match="token ids must be integers"):
        CharTokenizer.train("ab").decode(bad[-1:])


def test_integer_ids_of_every_kind_still_decode():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    tok, ct = BPETokenizer.train("hello world", 260), CharTokenizer.train("hi")
    for ids in ([104, 105], (104, 105), np.array([104, 105]), torch.tensor([104, 105]), [np.int64(104), 105]):
        assert tok.decode(ids) == "hi"
    for ids in ([0, 1], np.array([0, 1], dtype=np.uint16), torch.tensor([0, 1]), []):
        assert ct.decode(ids) == "hi"[: len(ids)]
    with pytest.raises(ValueError, match=r"id 260 is not in this tokenizer's vocabulary \(vocab_size is 260, ids"):
        tok.decode([260])


def test_an_unknown_character_gets_advice_that_fits_a_trained_model():
    "A CharTokenizer fixed by a trained model cannot be retrained: the message offers both ways out."
    with pytest.raises(ValueError, match=r"'\\ufeff' at position 0 is not one of the 2 characters") as e:
        CharTokenizer.train("ab").encode("\ufeffab")
    assert "replace it" in str(e.value) and "train anew" in str(e.value)
    assert "retrain it (CharTokenizer.train)" not in str(e.value)
    assert "a BPE, whose bytes spell any text (`gptbook train --tokenizer bpe`)" in str(e.value)  # F12: the CLI's fix


# ---------------------------------------------------------------- hostile Hugging Face tokenizer.json files


@pytest.fixture(scope="module")
def hf_json(split, tmp_path_factory):
    "The JSON of a small byte-level tokenizer.json with <|endoftext|>, as HF tokenizers saves it."
    hf = hf_trained(split[0][:50_000], 400)
    folder = tmp_path_factory.mktemp("hf_json")
    hf.save(str(folder / "tokenizer.json"))
    return json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))


def _without(d: dict, *path):
    d = json.loads(json.dumps(d))
    inner = d
    for key in path[:-1]:
        inner = inner[key]
    del inner[path[-1]]
    return d


def _with_split(d: dict, pattern) -> dict:
    "`d` pre-tokenizing with a Split of `pattern`, then ByteLevel without its regex (what to_hf writes)."
    split = {"type": "Split", "pattern": pattern, "behavior": "Isolated", "invert": False}
    return {
        **d,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, {**d["pre_tokenizer"], "use_regex": False}]},
    }


HOSTILE_HF = {  # the reliability review's malformed files, each once a KeyError, TypeError or AttributeError traceback
    "no_merges": lambda d: _without(d, "model", "merges"),
    "no_vocab": lambda d: _without(d, "model", "vocab"),
    "model_list": lambda d: {**d, "model": [1, 2]},
    "vocab_list": lambda d: {**d, "model": {**d["model"], "vocab": list(d["model"]["vocab"])}},
    "list": lambda d: [1, 2, 3],
    "null": lambda d: None,
    "pretok_list": lambda d: {**d, "pre_tokenizer": [d["pre_tokenizer"]]},
    "pattern_str": lambda d: _with_split(d, r"\S+|\s+"),  # a Split's pattern is {"Regex": ...}
    "added_nocontent": lambda d: {**d, "added_tokens": [{"id": 0}]},
    "added_str": lambda d: {**d, "added_tokens": "x"},
    "merges_ints": lambda d: {**d, "model": {**d["model"], "merges": [1, 2, 3]}},
    "dup_ids": lambda d: {**d, "model": {**d["model"], "vocab": {k: 7 for k in d["model"]["vocab"]}}},
    "str_id": lambda d: {**d, "model": {**d["model"], "vocab": {k: str(v) for k, v in d["model"]["vocab"].items()}}},
    "regex_bomb": lambda d: _with_split(d, {"Regex": BOMBS[0]}),
}


@pytest.mark.parametrize("name", HOSTILE_HF)
def test_a_malformed_hf_tokenizer_json_is_one_value_error_naming_it(hf_json, tmp_path, name):
    path = write(tmp_path / f"{name}.json", HOSTILE_HF[name](hf_json))
    with pytest.raises(ValueError) as e:
        BPETokenizer.from_hf(path)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value), str(e.value)


def test_the_unbroken_hf_tokenizer_json_reads(hf_json, tmp_path):
    tok = BPETokenizer.from_hf(write(tmp_path / "tokenizer.json", hf_json))
    assert tok.vocab_size == 400 and tok.pattern == GPT2_PATTERN and EOT in tok.special_tokens


# ---------------------------------------------------------------- as_tokenizer: theirs wrapped, ours as they are


def test_as_tokenizer_passes_ours_and_wraps_theirs(tok):
    ct = CharTokenizer.train("hello")
    assert as_tokenizer(tok) is tok and as_tokenizer(ct) is ct  # known by encode, decode and vocab_size
    tt = as_tokenizer(tok.to_tiktoken())
    hf = as_tokenizer(tok.to_hf())
    assert isinstance(tt, TokenizerAdapter) and isinstance(hf, TokenizerAdapter) and as_tokenizer(tt) is tt
    s = "naïve 🙂 ROMEO"
    assert tt.encode(s) == hf.encode(s) == tok.encode(s) and tt.decode(tok.encode(s)) == s == hf.decode(tok.encode(s))
    ids = tok.encode(s)
    assert [tt.token_bytes(i) for i in ids] == [hf.token_bytes(i) for i in ids] == [tok.vocab[i] for i in ids]
    assert tt.vocab_size == hf.vocab_size == tok.vocab_size
    with pytest.raises(TypeError, match="encode expects a str"):
        tt.encode(b"bytes")
    with pytest.raises(ValueError, match="is not an id of this tiktoken tokenizer"):
        tt.token_bytes(tok.vocab_size)
    with pytest.raises(TypeError, match="cannot be saved as a gptbook tokenizer file"):
        tt.save("x.json")
    with pytest.raises(TypeError, match="is not a tokenizer gptbook knows"):
        as_tokenizer("gpt2")


def test_an_id_outside_the_vocabulary_names_the_vocabulary_size():
    tok = BPETokenizer.train("hello world", 260)
    with pytest.raises(ValueError, match=r"id 260 is not in this tokenizer's vocabulary \(vocab_size is 260, ids"):
        tok.decode([260])
    with pytest.raises(ValueError, match=r"id -1 is not a valid CharTokenizer id \(vocab_size is 2"):
        CharTokenizer.train("ab").decode([-1])
