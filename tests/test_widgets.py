"""The widgets in a real browser: Chromium (driven by playwright, the system's `chromium`, nothing downloaded)
loads each widget from 127.0.0.1 with every other request aborted, the tests move its controls with the mouse
and the keyboard, and compare what the page shows with the same numbers computed in Python."""

import contextlib
import http.server
import json
import math
import re
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from gptbook.model import GPT, GPTConfig
from gptbook.positions import apply_rope, rope_angles
from gptbook.sample import filter_logits
from gptbook.tokenizer import GPT2_PATTERN, BPETokenizer, CharTokenizer, apply_merges, pretokenize
from gptbook.book.widgets import attention_explorer, bpe_stepper, rope_dial, rope_score, sampling_lab

# $GPTBOOK_CHROMIUM names another Chromium-based browser (GitHub's runners have Google Chrome preinstalled).
CHROMIUM = os.environ.get("GPTBOOK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
slow = pytest.mark.slow  # the tests that drive a browser
ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "gptbook" / "book" / "static"
PAGE = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8">'
    '<meta name="viewport" content="width=device-width, initial-scale=1"><title>widget</title></head>'
    "<body>{}</body></html>"
)
TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n"
) * 20
SENTENCE = "Before we proceed any further, hear me speak: you are all resolved!"


# --- the server and the browser -------------------------------------------------------------------


class _Pages(http.server.BaseHTTPRequestHandler):
    pages: dict = {}

    def do_GET(self):
        body = self.pages.get(self.path.lstrip("/"))
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.wfile.write((body or "not found").encode("utf-8"))

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no browser at {CHROMIUM}: apt-get install chromium (.ci/run does), or set GPTBOOK_CHROMIUM")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


@contextlib.contextmanager
def opened(browser, server, html: str, width: int = 900, js: bool = True):
    "A page showing `html` from 127.0.0.1 (every other request aborted); on leaving, no page error may have occurred."
    name = f"page{len(_Pages.pages)}.html"
    _Pages.pages[name] = PAGE.format(html)
    context = browser.new_context(viewport={"width": width, "height": 800}, java_script_enabled=js)
    page, errors, outside = context.new_page(), [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    def route(r):
        if r.request.url.startswith(server):
            return r.continue_()
        outside.append(r.request.url)
        return r.abort()

    page.route("**/*", route)
    page.goto(server + name)
    try:
        yield page
    finally:
        context.close()
    assert not errors, f"page errors: {errors}"
    assert not outside, f"the page asked for outside resources: {outside}"


def press(page, selector: str, *keys: str):
    page.focus(selector)
    for key in keys:
        page.keyboard.press(key)


def click_at(page, selector: str, fraction: float) -> None:
    "Click a slider `fraction` of the way along it (the mouse)."
    box = page.locator(selector).bounding_box()
    page.mouse.click(box["x"] + fraction * box["width"], box["y"] + box["height"] / 2)


def value(page, name: str) -> float:
    return float(page.input_value(f"[name={name}]"))


# --- BPE stepper ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bpe():
    tok = BPETokenizer.train(TEXT, 330, GPT2_PATTERN)
    chunks = [c.encode() for c in pretokenize(SENTENCE)]
    return tok, chunks, bpe_stepper(tok.merges, chunks, start=20)


def python_tokens(tok, chunks, n: int) -> list:
    "The encoder's ids for the sentence with only the first n merges."
    first = {pair: i for pair, i in tok.merges.items() if i < 256 + n}
    return [i for c in chunks for i in apply_merges(c, first)]


def shown_ids(page) -> list:
    ids = [int(i) for i in page.locator(".gbw-tok").evaluate_all("els => els.map(e => e.dataset.id)")]
    assert page.get_attribute(".gbw-tokens", "data-ids") == ",".join(map(str, ids))
    return ids


def check_bpe(page, tok, chunks):
    n = int(value(page, "merges"))
    ids = python_tokens(tok, chunks, n)
    assert shown_ids(page) == ids, f"at {n} merges"
    assert page.inner_text("output") == str(n)
    assert f"{len(ids)} tokens for {len(SENTENCE)} bytes, {len(SENTENCE) / len(ids):.2f} bytes per token" in (
        page.inner_text(".gbw-status")
    )
    return n


@slow
def test_bpe_stepper_matches_the_encoder(browser, server, bpe):
    tok, chunks, w = bpe
    with opened(browser, server, w.html) as page:
        seen = {check_bpe(page, tok, chunks)}  # the first picture, at 20 merges
        for keys in (["Home"], ["End"], ["ArrowLeft"] * 7, ["Home", "ArrowRight", "ArrowRight"], ["PageUp"]):
            press(page, "[name=merges]", *keys)
            seen.add(check_bpe(page, tok, chunks))
        for fraction in (0.1, 0.35, 0.8):
            click_at(page, "[name=merges]", fraction)
            seen.add(check_bpe(page, tok, chunks))
        press(page, "[name=merges]", "Home")
        page.click("button[data-action=next]")
        first = check_bpe(page, tok, chunks)
        assert first > 0 and python_tokens(tok, chunks, first - 1) == list(SENTENCE.encode()), "the first change"
        page.click("button[data-action=next]")
        second = check_bpe(page, tok, chunks)
        page.keyboard.press("Shift+Tab")  # from "next" to "previous", then Enter: the keyboard works the buttons
        page.keyboard.press("Enter")
        assert check_bpe(page, tok, chunks) == first < second
        assert page.locator(".gbw-new").count() >= 1, "the latest merge's tokens are outlined"
        assert len(seen) >= 6 and min(seen) == 0 and max(seen) == len(tok.merges)


def test_bpe_stepper_colours_neighbours_apart(bpe):
    "Tokens side by side at some step, and a merge and its two parts, get hues far apart; each id has one colour."
    from gptbook.book.widgets import _hue_gap, _token_hues

    _, _, w = bpe
    steps, merged = w.data["steps"], w.data["merge"]
    pairs = {(a, b) for _, ids in steps for a, b in zip(ids, ids[1:]) if a != b}
    pairs |= {(m[2], x) for m in merged.values() for x in m[:2]}
    hues = _token_hues(steps, merged)
    assert min(_hue_gap(hues[a], hues[b]) for a, b in pairs) >= 30
    by_id = min(_hue_gap(a * 137.508 % 360, b * 137.508 % 360) for a, b in pairs)
    assert by_id < 15, "the old rule (a hue from the id) had near collisions here"
    spans = set(re.findall(r'data-id="(\d+)" style="background:hsla\((\d+),', w.html))
    assert spans == {(str(i), str(hues[i])) for i in {int(i) for i, _ in spans}}, "each id has its own hue, everywhere"


# --- sampling lab ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab():
    g = torch.Generator().manual_seed(0)
    tokens = [chr(c) for c in range(32, 32 + 60)]
    logits = torch.randn(3, len(tokens), generator=g) * 2.5  # fixed logits: the widget does not care where from
    return sampling_lab(["ROMEO:", "JULIET:\nO ", "To be"], logits.numpy(), tokens)


def settings(page) -> dict:
    return {n: value(page, n) for n in ("temperature", "top_k", "top_p", "min_p")} | {
        "prompt": int(value(page, "prompt"))
    }


def check_sampling(page, data, tol=1e-6) -> dict:
    "The kept set and the shown probabilities against `filter_logits` on the page's own logits and settings."
    s, vocab = settings(page), len(data["tokens"])
    z = torch.tensor(
        [-math.inf if x is None else x for x in data["prompts"][s["prompt"]]["logits"]], dtype=torch.float64
    )
    k, p, m = int(s["top_k"]), s["top_p"], s["min_p"]
    f = filter_logits(z, s["temperature"], None if k == vocab else k, None if p == 1 else p, None if m == 0 else m)
    probs = f.softmax(-1)
    kept = sorted(int(i) for i in page.get_attribute(".gbw", "data-kept").split(","))
    assert kept == f.isfinite().nonzero().flatten().tolist(), s
    rows = page.locator(".gbw-row").evaluate_all("els => els.map(e => [Number(e.dataset.id), Number(e.dataset.p)])")
    assert rows[0][0] == int(z.argmax()) and abs(rows[0][1] - float(probs.max())) < 1e-4, s
    for i, shown in rows:
        assert abs(shown - float(probs[i])) < tol, (s, i)
    assert f"Kept {len(kept)} of {vocab} tokens" in page.inner_text(".gbw-status")
    return s


def bar_widths(page) -> list:
    "The widths of the bars and the outlines, in the page's units."
    return page.locator(".gbw-bar, .gbw-ref").evaluate_all("els => els.map(e => Number(e.getAttribute('width')))")


@slow
def test_sampling_lab_matches_filter_logits(browser, server, lab):
    with opened(browser, server, lab.html) as page:
        s = check_sampling(page, lab.data)
        assert (s["temperature"], s["top_k"], s["top_p"], s["min_p"]) == (0.8, 60, 0.9, 0)  # the book's defaults
        assert page.inner_text("output[for$=temperature]") == "0.80" and page.inner_text("output[for$=top_p]") == "0.90"
        assert page.locator(".gbw-off").count() > 0 and max(bar_widths(page)) == 250, "filtered, drawn to the longest"
        press(page, "[name=temperature]", "Home", *["ArrowRight"] * 10)  # 0.5
        press(page, "[name=top_p]", "End", "ArrowLeft", "ArrowLeft")  # 0.9
        s = check_sampling(page, lab.data)
        assert s["temperature"] == 0.5 and s["top_p"] == 0.9
        assert page.inner_text("output[for$=top_p]") == "0.90" and page.inner_text("output[for$=top_k]") == "off"
        press(page, "[name=prompt]", "ArrowDown")
        assert check_sampling(page, lab.data)["prompt"] == 1
        page.select_option("[name=prompt]", index=2)
        for name, fraction in (("top_k", 0.1), ("min_p", 0.3), ("temperature", 0.9), ("top_p", 0.5)):
            click_at(page, f"[name={name}]", fraction)
            check_sampling(page, lab.data)
        press(page, "[name=top_k]", "End", *["ArrowLeft"] * 50)  # the keyboard for top-k and min-p too
        press(page, "[name=min_p]", "Home", *["ArrowRight"] * 4)
        s = check_sampling(page, lab.data)
        assert (s["top_k"], s["min_p"]) == (10, 0.04)
        assert max(bar_widths(page)) == 250
        press(page, "[name=temperature]", "Home")  # greedy
        assert len(page.get_attribute(".gbw", "data-kept").split(",")) == 1 and check_sampling(page, lab.data)
        assert page.locator(".gbw-off").count() == 11, "11 of the 12 rows are removed at temperature 0"
        assert page.get_attribute(".gbw-row >> nth=0 >> .gbw-bar", "width") == "250.0", "probability 1 spans the row"


# --- attention explorer ------------------------------------------------------------------------------


def attention_weights(model, idx) -> np.ndarray:
    "(n_layers, n_heads, T, T): softmax(q k^T / sqrt(d_k)) under the causal mask, q and k from each block's c_attn."
    inputs = []
    hooks = [b.ln_1.register_forward_hook(lambda m, i, out: inputs.append(out)) for b in model.blocks]
    with torch.no_grad():
        model(idx)
        rows = []
        for block, x in zip(model.blocks, inputs):
            a = block.attn
            q, k, _ = a.c_attn(x).split(a.d_model, dim=-1)  # (1, T, d_model)
            q, k = (t.view(1, -1, a.n_heads, a.head_dim).transpose(1, 2) for t in (q, k))  # (1, h, T, d_k)
            scores = q @ k.transpose(-2, -1) / math.sqrt(a.head_dim)  # (1, h, T, T)
            T = scores.shape[-1]
            rows.append(scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")).softmax(-1)[0])
    for h in hooks:
        h.remove()
    return torch.stack(rows).numpy()


@pytest.fixture(scope="module")
def explorer():
    line = "ROMEO:\nBut, soft! what light through"
    tok = CharTokenizer.train(line)
    torch.manual_seed(0)
    model = GPT(GPTConfig.baby(tok.vocab_size, n_layers=2, n_heads=2, d_model=16, max_seq_len=40)).eval()
    weights = attention_weights(model, torch.tensor([tok.encode(line)]))
    np.testing.assert_allclose(weights.sum(-1), 1, atol=1e-6)
    return list(line), weights, attention_explorer(list(line), weights)


def check_row(page, weights) -> tuple:
    layer, head = int(value(page, "layer")), int(value(page, "head"))
    q = int(page.get_attribute(".gbw-tokens", "data-query"))
    shown = page.locator(".gbw-tok").evaluate_all(
        "els => els.map(e => e.dataset.w === undefined ? null : +e.dataset.w)"
    )
    assert shown[q + 1 :] == [None] * (len(shown) - q - 1), "tokens after the query show no weight"
    np.testing.assert_allclose(shown[: q + 1], weights[layer, head, q, : q + 1], atol=1e-4)
    assert page.get_attribute(f".gbw-tok[data-pos='{q}']", "tabindex") == "0"
    assert f"Layer {layer}, head {head}: the token at position {q} " in page.inner_text(".gbw-status")
    return layer, head, q


@slow
def test_attention_explorer_shows_the_rows(browser, server, explorer):
    tokens, weights, w = explorer
    T = len(tokens)
    with opened(browser, server, w.html) as page:
        assert check_row(page, weights) == (0, 0, T - 1)
        page.hover(".gbw-tok[data-pos='9']")  # the mouse
        assert check_row(page, weights) == (0, 0, 9)
        press(page, "[name=layer]", "ArrowDown")
        page.select_option("[name=head]", index=1)
        assert check_row(page, weights) == (1, 1, 9)
        page.focus(".gbw-tok[data-pos='9']")  # the keyboard: the query token, then the arrows
        page.keyboard.press("ArrowLeft")
        page.keyboard.press("ArrowLeft")
        assert check_row(page, weights) == (1, 1, 7)
        assert page.evaluate("document.activeElement.dataset.pos") == "7"
        page.keyboard.press("Home")
        assert check_row(page, weights) == (1, 1, 0)
        page.keyboard.press("End")
        assert check_row(page, weights) == (1, 1, T - 1)
        press(page, "[name=head]", "ArrowUp")
        assert check_row(page, weights) == (1, 0, T - 1)


# --- RoPE dial -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dial():
    head_dim = 16
    cos, sin = rope_angles(2, head_dim, dtype=torch.float64)
    theta = torch.atan2(sin[1], cos[1])  # the angle per position of each pair: gptbook.positions' frequencies
    g = torch.Generator().manual_seed(1)
    q, k = (
        torch.randn(head_dim, dtype=torch.float64, generator=g),
        torch.randn(head_dim, dtype=torch.float64, generator=g),
    )
    return q, k, rope_dial(q.numpy(), k.numpy(), theta.numpy(), offset=3, max_position=120)


def python_score(q, k, m: int, n: int) -> float:
    "q at position m dotted with k at position n, rotated by apply_rope."
    cos, sin = rope_angles(max(m, n) + 1, len(q), dtype=torch.float64)
    return float(
        (
            apply_rope(q[None], cos[m : m + 1], sin[m : m + 1]) * apply_rope(k[None], cos[n : n + 1], sin[n : n + 1])
        ).sum()
    )


def check_score(page, q, k) -> tuple:
    n, offset = int(value(page, "position")), int(value(page, "offset"))
    score = float(page.get_attribute(".gbw", "data-score"))
    assert abs(score - python_score(q, k, n + offset, n)) < 1e-6, (n, offset)
    assert f"score q\u00b7k = {score:.6f}" in page.inner_text(".gbw-status")
    return n, offset, score


@slow
def test_rope_dial_score_depends_on_the_offset_only(browser, server, dial):
    q, k, w = dial
    with opened(browser, server, w.html) as page:
        x2 = page.get_attribute(".gbw-dial[data-pair='0'] .gbw-q", "x2")
        scores = [check_score(page, q, k)[2]]
        press(page, "[name=position]", "ArrowRight", "ArrowRight")
        assert page.get_attribute(".gbw-dial[data-pair='0'] .gbw-q", "x2") != x2, "the fastest pair turned"
        scores.append(check_score(page, q, k)[2])
        for fraction in (0.3, 0.9):
            click_at(page, "[name=position]", fraction)
            scores.append(check_score(page, q, k)[2])
        press(page, "[name=position]", "End")
        n, offset, score = check_score(page, q, k)
        scores.append(score)
        assert (n, offset) == (120, 3) and np.ptp(scores) < 1e-6, scores
        press(page, "[name=offset]", "ArrowRight")
        assert check_score(page, q, k)[1:] == (4, pytest.approx(rope_score(q, k, w.data["theta"], 124, 120), abs=1e-9))
        click_at(page, "[name=offset]", 0.75)
        n, offset, score = check_score(page, q, k)
        assert offset > 4 and score == pytest.approx(rope_score(q, k, w.data["theta"], n + offset, n), abs=1e-9)


# --- every widget: no sideways scrolling, and a picture without JavaScript -----------------------------


@pytest.fixture(scope="module")
def widgets(bpe, lab, explorer, dial):
    return {"bpe": bpe[2], "sampling": lab, "attention": explorer[2], "rope": dial[2]}


@slow
@pytest.mark.parametrize("name", ["bpe", "sampling", "attention", "rope"])
def test_dark_theme(browser, server, widgets, name):
    "On a dark page the text and the drawing's strokes take the page's colour (currentColor), not black."
    dark = '<div style="background:#1e1e1e;color:rgb(230, 230, 230)">' + widgets[name].html + "</div>"
    with opened(browser, server, dark) as page:
        colours = page.evaluate(
            """() => [...document.querySelectorAll('.gbw-status, .gbw-title, .gbw-tok, svg text, output, label')]
                 .map(e => getComputedStyle(e)[e instanceof SVGElement ? 'fill' : 'color'])"""
        )
        assert colours and set(colours) == {"rgb(230, 230, 230)"}, set(colours)


@slow
@pytest.mark.parametrize("name", ["bpe", "sampling", "attention", "rope"])
def test_narrow_screen_and_no_javascript(browser, server, widgets, name):
    "Without JavaScript the page shows Python's picture, the same as the script's first drawing."
    w = widgets[name]
    assert w.size < 300_000
    with opened(browser, server, w.html, width=375) as page:
        assert page.evaluate("document.documentElement.scrollWidth") <= 375
        assert page.locator(".gbw.gbw-live").count() == 1
        live = page.inner_text(".gbw-figure"), page.evaluate(DRAWN)
    with opened(browser, server, w.html, width=375, js=False) as page:
        assert page.locator(".gbw-live").count() == 0, "JavaScript is off"
        assert page.locator(".gbw-figure svg, .gbw-figure .gbw-tok").count() > 0, "the static picture is there"
        assert (page.inner_text(".gbw-figure"), page.evaluate(DRAWN)) == live
        assert page.evaluate("document.documentElement.scrollWidth") <= 375


# what both draw besides the text: the tokens' ids, weights and colours, the arrows' ends, the bars' widths
DRAWN = """() => [...document.querySelectorAll(
    '.gbw-figure [data-ids], .gbw-figure [data-w], .gbw-figure line, .gbw-figure rect, .gbw-figure .gbw-tok[data-id]')]
  .map(e => [e.getAttribute('data-ids'), e.getAttribute('data-w'), e.getAttribute('x2'), e.getAttribute('y2'),
             e.getAttribute('width'), e.getAttribute('style')])"""


# --- unusual data, hostile text ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: sampling_lab(["a"], [[math.nan, 0.0]], ["x", "y"]), "finite or -inf"),
        (lambda: sampling_lab(["a"], [[-math.inf, -math.inf]], ["x", "y"]), "a finite one for every prompt"),
        (lambda: sampling_lab([], np.zeros((0, 2)), ["x", "y"]), "needs a prompt and a token, got 0 prompts"),
        (lambda: attention_explorer(["a"], [[[[math.nan]]]]), "must be finite"),
        (lambda: attention_explorer([], np.zeros((1, 1, 0, 0))), "none 0"),
        (lambda: attention_explorer(["a", "b"], np.ones((1, 1, 2, 2)), query=2), "query must be a position in 0..1"),
        (lambda: bpe_stepper({(97, 97): 256}, []), "hold no bytes"),
        (lambda: rope_dial([1.0, math.nan], [1.0, 0.0], [0.5]), "must be finite"),
        (lambda: rope_dial([], [], []), "len(theta) >= 1"),
    ],
)
def test_bad_data_is_refused_in_one_line(build, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build()


@slow
def test_unusual_data_draws(browser, server):
    "Masked logits, a row of zero weights, zero vectors and a tokenizer with no merges: pages that work."
    z = torch.randn(2, 30, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 2
    z[0, z[0].argsort()[-3:]] = -math.inf  # the three most likely tokens of the first prompt masked out
    z[1, ::2] = -math.inf
    lab = sampling_lab(["masked", "half"], z.numpy(), [chr(65 + i) for i in range(30)], temperature=1, top_p=1)
    with opened(browser, server, lab.html) as page:
        assert check_sampling(page, lab.data)["prompt"] == 0 and page.locator(".gbw-off").count() == 0
        press(page, "[name=top_k]", "End", *["ArrowLeft"] * 20)  # top-k 10
        check_sampling(page, lab.data)
        press(page, "[name=temperature]", "Home")  # greedy
        check_sampling(page, lab.data)
        page.select_option("[name=prompt]", index=1)
        assert len(page.get_attribute(".gbw", "data-kept").split(",")) == 1 and check_sampling(page, lab.data)
    weights = np.tril(np.ones((3, 3)))[None, None] / np.arange(1, 4)[:, None]
    weights[0, 0, 2] = 0  # the last token attends to nothing
    zero = attention_explorer(list("abc"), weights)
    with opened(browser, server, zero.html) as page:
        assert "puts 0.0000 of its attention on position 0" in page.inner_text(".gbw-status")
        page.hover(".gbw-tok[data-pos='1']")
        assert page.get_attribute(".gbw-tok[data-pos='0']", "data-w") == "0.5000"
    widgets = rope_dial(np.zeros(4), np.zeros(4), [1.0, 0.1]).html + bpe_stepper({}, [b"no merges"]).html
    with opened(browser, server, widgets) as page:
        press(page, "[name=position]", "End")
        assert "score q\u00b7k = 0.000000" in page.inner_text(".gbw[id^=gbw-rope] .gbw-status")
        assert "nan" not in page.inner_html(".gbw-dials").lower()
        page.click("button[data-action=next]")
        assert page.locator(".gbw-tok").count() == len(b"no merges")


HOSTILE = [
    "</script><script>window.__xss=1</script>",
    '"><img src=x onerror="window.__xss=2">',
    "'><svg onload=window.__xss=3>",
    "<!--<script>window.__xss=4</script>-->",
    "\u2028\u2029</SCRIPT ><script>window.__xss=5</script>",
    "${window.__xss=6}`+(window.__xss=7)+`",
]


@slow
def test_hostile_text_stays_text(browser, server):
    "Token texts and titles that try to break out of a script, an attribute or a comment are shown as text."
    text = "".join(HOSTILE) * 3
    tok = BPETokenizer.train(text, 300)  # no pre-tokenizer: merged tokens carry whole payloads
    weights = np.tril(np.ones((6, 6)))[None, None] / np.arange(1, 7)[:, None]
    parts = [
        bpe_stepper(tok.merges, [text.encode()], title=HOSTILE[0]),
        bpe_stepper(tok.merges, [text.encode()], start=0, title=HOSTILE[1]),
        sampling_lab(HOSTILE, np.eye(6), HOSTILE, title=HOSTILE[2]),
        attention_explorer(HOSTILE, weights, title=HOSTILE[3]),
        rope_dial(np.ones(2), np.ones(2), np.ones(1), title=HOSTILE[4]),
    ]
    with opened(browser, server, "".join(w.html for w in parts)) as page:
        for control in page.locator("input[type=range], select").all():
            control.focus()
            for key in ("End", "Home", "ArrowDown"):
                page.keyboard.press(key)
        for button in page.locator("button").all():
            button.click()
        for token in page.locator(".gbw-figure .gbw-tok").all()[:12]:
            token.hover()
        assert page.evaluate("window.__xss") is None
        assert page.locator("img, iframe, svg[onload]").count() == 0
        assert page.locator("script").count() == 2 * len(parts)
        assert page.locator(".gbw.gbw-live").count() == len(parts)
        assert HOSTILE[0] in page.inner_text(".gbw-title >> nth=0")


def test_scripts_are_package_files_the_appendix_shows():
    "Each script is a file of gptbook/book/static/ that cannot end its <script> element, listed in appendix A5."
    nb = json.loads((ROOT / "nbs" / "A5_widgets.ipynb").read_text())
    listed = "".join(
        "".join(o.get("data", {}).get("text/markdown", "")) for c in nb["cells"] for o in c.get("outputs", [])
    )
    for name in ("shell", "bpe", "sampling", "attention", "rope"):
        js = (STATIC / f"{name}.js").read_text(encoding="utf-8")
        assert "</" not in js and "<!--" not in js, name
        assert js in listed, f"nbs/A5_widgets.ipynb lists an older {name}.js: run it again"
        assert (STATIC / f"{name}.css").is_file()


# --- the outputs saved in the chapters ---------------------------------------------------------------


def saved_widget(notebook: str, name: str) -> tuple[str, dict]:
    "The HTML of the widget `name` saved in `notebook`'s outputs, and the data inside it."
    nb = json.loads((ROOT / "nbs" / notebook).read_text())
    found = [
        "".join(o["data"]["text/html"])
        for c in nb["cells"]
        for o in c.get("outputs", [])
        if "text/html" in o.get("data", {}) and f'id="gbw-{name}-' in "".join(o["data"]["text/html"])
    ]
    assert len(found) == 1, f"{notebook} should hold one saved {name} widget, found {len(found)}"
    data = re.search(r'<script type="application/json" class="gbw-data">(.*?)</script>', found[0], re.S).group(1)
    return found[0], json.loads(data)


SAVED = {
    "bpe": "01_tokenizer.ipynb",
    "attention": "03_attention.ipynb",
    "rope": "04_positions.ipynb",
    "sampling": "09_sampling.ipynb",
}


@slow
@pytest.mark.parametrize("name", sorted(SAVED))
def test_saved_chapter_widgets_load_and_work(browser, server, name):
    html, data = saved_widget(SAVED[name], name)
    assert len(html.encode()) <= 300_000, f"{len(html.encode()):,} bytes"
    with opened(browser, server, html, width=375) as page:
        assert page.locator(".gbw.gbw-live").count() == 1
        assert page.evaluate("document.documentElement.scrollWidth") <= 375
        SAVED_CHECKS[name](page, data)


def _saved_bpe(page, data):
    spelled = None
    for keys in (["Home"], ["End"], ["Home", "PageUp"], ["End", "ArrowLeft"]):
        press(page, "[name=merges]", *keys)
        text = "".join(page.locator(".gbw-tok").all_inner_texts())
        assert spelled in (None, text), "at every number of merges the tokens spell the same sentence"
        spelled = text
    press(page, "[name=merges]", "Home")
    assert page.locator(".gbw-tok").count() == data["n_bytes"], "no merges: one token per byte"


def _saved_sampling(page, data):
    "The BPE baby's real logits: the page keeps what filter_logits keeps, for every prompt."
    press(page, "[name=temperature]", "Home", *["ArrowRight"] * 10)
    press(page, "[name=top_p]", "End", "ArrowLeft", "ArrowLeft")
    for prompt in range(len(data["prompts"])):
        page.select_option("[name=prompt]", index=prompt)
        assert check_sampling(page, data)["prompt"] == prompt
    click_at(page, "[name=min_p]", 0.2)
    check_sampling(page, data)


def _saved_attention(page, data):
    "The trained baby's rows: what the page shows is what the notebook computed, and each row sums to 1."
    T, H = page.locator(".gbw-tok").count(), data["n_heads"]
    weights = np.zeros((len(data["weights"]) // H, H, T, T))
    for n, flat in enumerate(data["weights"]):
        rows = np.split(np.array(flat) / 1e4, np.cumsum(np.arange(1, T)))
        for q, row in enumerate(rows):
            weights[n // H, n % H, q, : q + 1] = row
    np.testing.assert_allclose(weights.sum(-1), 1, atol=T * 5e-5)
    page.select_option("[name=layer]", index=2)
    press(page, "[name=head]", "ArrowDown")
    page.hover(".gbw-tok[data-pos='20']")
    assert check_row(page, weights) == (2, 1, 20)
    page.keyboard.press("Tab")  # from the head's select to the query token
    page.keyboard.press("ArrowRight")
    assert check_row(page, weights) == (2, 1, 21)


def _saved_rope(page, data):
    "The chapter's q and k at positions the slider reaches: the score of apply_rope, constant along them."
    q, k = (torch.tensor(data[name], dtype=torch.float64) for name in "qk")
    cos, sin = rope_angles(2, len(q), dtype=torch.float64)
    np.testing.assert_allclose(data["theta"], torch.atan2(sin[1], cos[1]), rtol=1e-12)  # gptbook.positions' theta
    scores = [check_score(page, q, k)[2]]
    for keys in (["ArrowRight"] * 3, ["End"], ["PageDown"]):
        press(page, "[name=position]", *keys)
        scores.append(check_score(page, q, k)[2])
    assert np.ptp(scores) < 1e-6


SAVED_CHECKS = {"bpe": _saved_bpe, "sampling": _saved_sampling, "attention": _saved_attention, "rope": _saved_rope}


@slow
def test_side_by_side_under_require_js(browser, server, widgets):
    "Quarto loads require.js on pages with HTML outputs: the widgets define no globals and keep to their own ids."
    amd = "<script>var define = function () { throw new Error('define called'); }; define.amd = {};</script>"
    with opened(browser, server, amd + "".join(w.html for w in widgets.values())) as page:
        assert page.locator(".gbw.gbw-live").count() == 4
        before = page.inner_text("#" + page.get_attribute(".gbw[id^=gbw-rope]", "id") + " .gbw-status")
        press(page, "[name=merges]", "Home")
        assert page.locator(".gbw[id^=gbw-bpe] .gbw-tok").count() == len(SENTENCE)
        assert page.inner_text(".gbw[id^=gbw-rope] .gbw-status") == before, "the other widgets did not move"
        assert page.evaluate("Object.keys(window).filter(k => /^(data|ui|draw|root|steps)$/.test(k))") == []
