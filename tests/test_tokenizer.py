"""gptbook.tokenizer against independent references: the naive loop for the fast trainer's merges,
tiktoken and HF tokenizers for the ids, plus round trips, the file format and the error messages."""

import json
import warnings

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
    with pytest.raises(ValueError, match="not special tokens"):
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


def test_files_without_type_are_recognised_by_their_keys(tok, tmp_path):
    (tmp_path / "char.json").write_text(json.dumps({"chars": ["a", "b"]}), encoding="utf-8")
    assert load_tokenizer(tmp_path / "char.json").chars == ["a", "b"]
    assert CharTokenizer.load(tmp_path / "char.json").chars == ["a", "b"]
    tok.save(tmp_path / "tok.json")
    d = json.loads((tmp_path / "tok.json").read_text(encoding="utf-8"))
    del d["type"], d["version"]
    (tmp_path / "old.json").write_text(json.dumps(d), encoding="utf-8")
    for back in (load_tokenizer(tmp_path / "old.json"), BPETokenizer.load(tmp_path / "old.json")):
        assert type(back) is BPETokenizer and back.merges == tok.merges and back.special_tokens == tok.special_tokens
    with pytest.raises(ValueError, match="use BPETokenizer.load"):
        CharTokenizer.load(tmp_path / "old.json")


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

    calls, dumps = [], json.dumps

    def dumps_then_fail(*args, **kwargs):
        calls.append(1)
        if len(calls) > 5:
            raise RuntimeError("disk full")
        return dumps(*args, **kwargs)

    monkeypatch.setattr(json, "dumps", dumps_then_fail)  # fails halfway through the file
    with pytest.raises(RuntimeError, match="disk full"):
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
    with pytest.raises(TypeError, match="must be an int"):
        BPETokenizer.train("hello", 300.0)
    with pytest.raises(TypeError, match="must be an int"):
        BPETokenizer.train("hello", True)
    with pytest.raises(ValueError, match="empty"):
        BPETokenizer.train("", 300)
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
    with pytest.raises(ValueError, match="empty"):
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
    from gptbook.tokenizer import _byte_to_char

    table = _byte_to_char()
    return [table[b] for b in range(256)]
