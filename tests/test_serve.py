"""`gptbook serve` against real clients: the official `openai` package (plain and streaming, the same text as
`generate` for the same seed), raw HTTP for the bad requests (OpenAI's error shape, a 4xx, and the server still
answers), a client that leaves mid-stream, Chromium on the chat page; and `gptbook chat` with its input faked."""

import argparse
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason='the server needs its extra: pip install "gptbook[serve]"')
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai", reason="the tests talk to the server with the official openai client")

from gptbook.chat import chat_ids, render  # noqa: E402
from gptbook.checkpoint import load_checkpoint  # noqa: E402
from gptbook.config import GPTConfig  # noqa: E402
from gptbook.sample import SamplingConfig, generate  # noqa: E402
from gptbook.serve import chat_loop, create_app  # noqa: E402
from gptbook.train import TrainConfig, train, train_sft  # noqa: E402
from test_widgets import browser  # noqa: E402, F401 (the Chromium fixture of the widget tests)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 64
QUESTION = [{"role": "user", "content": "What is 12 + 34?"}]
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\nWhat is 12 + 34? 46\n" * 40


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    "A tiny BPE model trained 2 steps, then fine-tuned 2 steps on the add task: its answers are noise, but fixed."
    work = tmp_path_factory.mktemp("serve")
    (work / "text.txt").write_text(TEXT, encoding="utf-8")
    cfg = TrainConfig(
        out_dir=str(work / "base"), data_path=str(work / "text.txt"), tokenizer="bpe", bpe_vocab_size=280,
        max_iters=2, eval_interval=2, eval_iters=1, batch_size=2, warmup_iters=0, progress=False,
    )  # fmt: skip
    train(cfg, model_config=GPTConfig.baby(280, n_layers=1, n_heads=2, d_model=32, max_seq_len=CONTEXT))
    out = work / "sft"
    train_sft(init_from=cfg.out_dir, task="add", out_dir=str(out), max_iters=2, eval_interval=2, eval_iters=1,
              batch_size=2, warmup_iters=0, progress=False)  # fmt: skip
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(run):
    "The app on uvicorn in a thread, at 127.0.0.1 and a free port; `server.delay` slows each token (seconds)."
    app = create_app(run)
    model = app.state.server.model
    state = argparse.Namespace(delay=0.0, app=app, forwards=0, threads=[])

    def slow(*_):
        state.forwards += 1
        state.threads.append(threading.get_ident())
        time.sleep(state.delay)

    hook = model.register_forward_pre_hook(slow)
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    while not uv.started:
        assert thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    state.url, state.port = f"http://127.0.0.1:{port}", port
    yield state
    uv.should_exit = True
    thread.join(10)
    hook.remove()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)


def expected(model, tokenizer, ids, seed, max_tokens, temperature=1.0, top_p=None, stop=None) -> str:
    "What gptbook.sample.generate writes after `ids` with a generator seeded by `seed`: the reference."
    config = SamplingConfig(max_tokens, temperature, top_p=top_p, stop=stop)
    g = torch.Generator().manual_seed(seed)
    new = generate(model, torch.tensor([ids]), config=config, generator=g)[0, len(ids) :].tolist()
    cut = next((i for i, t in enumerate(new) if t in (stop or ())), len(new))
    return tokenizer.decode(new[:cut])


def chat_expected(server, messages, seed, max_tokens, **kw):
    s = server.app.state.server
    ids = render(messages, s.tokenizer, generation=True)[0]
    return expected(s.model, s.tokenizer, ids, seed, max_tokens, stop=chat_ids(s.tokenizer), **kw)


# --- the openai client ------------------------------------------------------------------------------


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["sft"]


@pytest.mark.parametrize("seed, temperature, top_p", [(0, 1.0, None), (7, 0.7, 0.9), (3, 0.0, None)])
def test_chat_is_generate_for_the_same_seed_plain_and_streamed(server, client, seed, temperature, top_p):
    kw = dict(seed=seed, max_tokens=20, temperature=temperature) | ({} if top_p is None else dict(top_p=top_p))
    want = chat_expected(server, QUESTION, seed, 20, temperature=temperature, top_p=top_p)
    r = client.chat.completions.create(model="sft", messages=QUESTION, **kw)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(render(QUESTION, server.app.state.server.tokenizer, generation=True)[0])
    assert r.choices[0].finish_reason == ("length" if r.usage.completion_tokens == 20 else "stop")
    chunks = list(client.chat.completions.create(model="sft", messages=QUESTION, stream=True, **kw))
    assert len(chunks) > 2 and chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want


def test_a_conversation_and_stop_strings(server, client):
    turns = [*QUESTION, {"role": "assistant", "content": "46"}, {"role": "user", "content": "And 1 + 1?"}]
    want = chat_expected(server, turns, 5, 16)
    r = client.chat.completions.create(model="sft", messages=turns, seed=5, max_tokens=16)
    assert r.choices[0].message.content == want
    stop = next(c for c in want[1:] if c.isprintable())  # a character the reply holds: it must end before it
    r = client.chat.completions.create(model="sft", messages=turns, seed=5, max_tokens=16, stop=[stop, "zzz"])
    assert r.choices[0].message.content == want.split(stop)[0] and r.choices[0].finish_reason == "stop"


def test_completions_continue_the_prompt(server, client):
    s = server.app.state.server
    want = expected(s.model, s.tokenizer, s.tokenizer.encode("Before we"), 11, 12)
    r = client.completions.create(model="sft", prompt="Before we", seed=11, max_tokens=12)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    chunks = list(client.completions.create(model="sft", prompt="Before we", seed=11, max_tokens=12, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want


def test_no_seed_samples_and_the_default_fills_the_context(server, client):
    r = client.chat.completions.create(model="sft", messages=QUESTION)
    n = len(render(QUESTION, server.app.state.server.tokenizer, generation=True)[0])
    assert r.usage.total_tokens <= CONTEXT and (r.usage.total_tokens == CONTEXT or r.choices[0].finish_reason == "stop")
    assert n == r.usage.prompt_tokens


# --- bad requests -----------------------------------------------------------------------------------


def post(server, path: str, body, timeout=30):
    "POST `body` (bytes as they are, anything else as JSON) to the server: (status, parsed JSON reply)."
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, json.loads(r.read())


CHAT, COMPLETE = "/v1/chat/completions", "/v1/completions"
LONG = [{"role": ("user", "assistant")[i % 2], "content": "What is 123 + 456?"} for i in range(9)]
BAD = [
    (CHAT, {"messages": [{"role": "assistant", "content": "hi"}]}, 400, "messages", "not 'user'"),
    (CHAT, {"messages": [{"role": "system", "content": "be kind"}, *QUESTION]}, 400, "messages", "'system'"),
    (CHAT, {"messages": [*QUESTION, *QUESTION]}, 400, "messages", "alternate"),
    (CHAT, {"messages": []}, 400, "messages", "non-empty list"),
    (CHAT, {}, 400, "messages", "non-empty list"),
    (CHAT, {"messages": [{"role": "user", "content": ""}]}, 400, "messages", "non-empty text"),
    (CHAT, {"messages": [{"role": "user", "content": "hi <|end|>"}]}, 400, "messages", "chat token"),
    (CHAT, {"messages": LONG}, 400, "messages", "context is 64"),
    (CHAT, b'\xff\xfe{"messages": []}', 400, None, "UTF-8"),
    (CHAT, b"{'messages': nope", 400, None, "JSON object"),
    (CHAT, [1, 2], 400, None, "JSON object"),
    (CHAT, {"messages": QUESTION, "max_tokens": 10**9}, 400, "max_tokens", "max_tokens must be in [0, 1000000]"),
    (CHAT, {"messages": QUESTION, "max_tokens": 60}, 400, "max_tokens", "over the context of 64"),
    (CHAT, {"messages": QUESTION, "max_tokens": -1}, 400, "max_tokens", "max_tokens must be"),
    (CHAT, {"messages": QUESTION, "max_tokens": "ten"}, 400, "max_tokens", "integer"),
    (CHAT, {"messages": QUESTION, "temperature": -0.5}, 400, "temperature", ">= 0"),
    (CHAT, {"messages": QUESTION, "temperature": "hot"}, 400, "temperature", "number"),
    (CHAT, {"messages": QUESTION, "top_p": 0}, 400, "top_p", "(0, 1]"),
    (CHAT, {"messages": QUESTION, "top_p": 1.5}, 400, "top_p", "(0, 1]"),
    (CHAT, {"messages": QUESTION, "n": 2}, 400, "n", "n must be 1"),
    (CHAT, {"messages": QUESTION, "seed": -1}, 400, "seed", "seed must be"),
    (CHAT, {"messages": QUESTION, "seed": 1.5}, 400, "seed", "integer"),
    (CHAT, {"messages": QUESTION, "stop": [1, 2]}, 400, "stop", "stop must be"),
    (CHAT, {"messages": QUESTION, "stream": "yes"}, 400, "stream", "true or false"),
    (CHAT, {"messages": QUESTION, "model": "gpt-4"}, 404, "model", "does not exist"),
    (COMPLETE, {"prompt": ""}, 400, "prompt", "non-empty string"),
    (COMPLETE, {"prompt": ["a", "b"]}, 400, "prompt", "non-empty string"),
    (COMPLETE, {"prompt": "hi <|user|>"}, 400, None, "special"),
    (COMPLETE, {"prompt": "x" * 80}, 400, "prompt", "context is 64"),
]


@pytest.mark.parametrize("path, body, status, param, text", BAD, ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD)])
def test_bad_requests_get_openai_s_error_shape_and_the_server_goes_on(server, path, body, status, param, text):
    got, reply = post(server, path, body)
    assert got == status, reply
    assert set(reply) == {"error"} and set(reply["error"]) == {"message", "type", "param", "code"}, reply
    assert reply["error"]["type"] == "invalid_request_error" and reply["error"]["param"] == param, reply
    assert text in reply["error"]["message"], reply
    assert post(server, COMPLETE, {"prompt": "Before", "max_tokens": 2})[0] == 200


def test_the_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="sft", messages=QUESTION, temperature=-1)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4", messages=QUESTION)
    assert e.value.body["code"] == "model_not_found"


def test_unknown_paths_and_methods_are_in_the_error_shape_too(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for method, path, status in (("GET", "/v1/nothing", 404), ("GET", CHAT, 405)):
        conn.request(method, path)
        r = conn.getresponse()
        assert r.status == status and set(json.loads(r.read())["error"]) == {"message", "type", "param", "code"}


def test_a_client_that_leaves_mid_stream_frees_the_server(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    body = json.dumps({"messages": QUESTION, "stream": True, "max_tokens": 40, "temperature": 1.0}).encode()
    head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    server.delay, server.forwards = 0.05, 0  # 40 tokens: 2 s if the generation went on
    try:
        s.sendall(head.encode() + body)
        got = b""
        while b"data: " not in got:
            got += s.recv(4096)
        s.close()  # gone after the first tokens
        t0 = time.perf_counter()
        assert post(server, COMPLETE, {"prompt": "Before", "max_tokens": 2})[0] == 200
        assert time.perf_counter() - t0 < 1.5, "the next request waited for the abandoned generation"
        assert server.forwards < 40 + 2, "the abandoned generation went on to its end"
    finally:
        server.delay = 0.0


def test_requests_wait_for_each_other(server, client):
    "Two requests at once: the lock serves one generation at a time, and each gets its own seed's text."
    want = chat_expected(server, QUESTION, 1, 10)
    got = []
    threads = [
        threading.Thread(
            target=lambda: got.append(
                client.chat.completions.create(model="sft", messages=QUESTION, seed=1, max_tokens=10)
                .choices[0]
                .message.content
            )
        )  # fmt: skip
        for _ in range(2)
    ]
    server.delay, server.threads = 0.01, []
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        server.delay = 0.0
    assert got == [want, want]
    turns = [a != b for a, b in zip(server.threads, server.threads[1:])]
    assert sum(turns) == 1, "the two generations ran at the same time"  # one thread's tokens, then the other's


# --- the chat page in Chromium ----------------------------------------------------------------------


WATCH = """() => { window.seen = [];
  new MutationObserver(() => { const a = document.querySelector('#log > div:last-child');
    if (a) seen.push([performance.now(), a.className, a.textContent]); })
  .observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true}); }"""


def ask(page, text: str) -> tuple[str, list]:
    "Type `text`, press Enter, wait for the reply: (its text, the updates the page showed while it came)."
    page.evaluate(WATCH)
    page.fill("#text", text)
    n = page.locator("#log > div").count()
    page.press("#text", "Enter")  # the two new bubbles and the busy mark come in one task: no wait can miss them
    done = (
        f"document.querySelectorAll('#log > div').length === {n + 2} && !document.getElementById('form').dataset.busy"
    )
    page.wait_for_function(done, timeout=20000)
    return page.locator("#log > div").last.text_content(), page.evaluate("window.seen")


def test_the_chat_page_streams_and_answers_as_the_api(server, client, browser):  # noqa: F811 (test_widgets)
    context = browser.new_context()
    page, errors, outside = context.new_page(), [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route(
        "**/*", lambda r: r.continue_() if r.request.url.startswith(server.url) else outside.append(r) or r.abort()
    )
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent === 'sft'")
    page.click("summary")
    for key, value in (("temperature", "1"), ("top_p", "0.9"), ("max_tokens", "12"), ("seed", "4")):
        page.fill(f"#{key}", value)
    server.delay = 0.03  # a token every 30 ms: the updates come apart in time
    try:
        first, seen = ask(page, QUESTION[0]["content"])
        texts = [t for _, kind, t in seen if kind == "assistant"]
        assert len(set(texts)) > 2, f"the reply did not stream in: {seen}"  # empty, partial, ..., whole
        assert seen[-1][0] - seen[1][0] > 0.1 * 1000, "the updates came all at once"
        settings = dict(model="sft", seed=4, max_tokens=12, temperature=1.0, top_p=0.9)
        assert first == client.chat.completions.create(messages=QUESTION, **settings).choices[0].message.content
        turns = [*QUESTION, {"role": "assistant", "content": first}, {"role": "user", "content": "And 1 + 1?"}]
        second, _ = ask(page, "And 1 + 1?")  # the page sends the whole conversation
        assert second == client.chat.completions.create(messages=turns, **settings).choices[0].message.content
        page.fill("#max_tokens", "1000")
        error, _ = ask(page, "Too long now?")
        assert "context" in error and page.locator("#log > div").last.get_attribute("class") == "error"
    finally:
        server.delay = 0.0
        context.close()
    assert not errors and not outside, (errors, outside)


# --- gptbook chat -----------------------------------------------------------------------------------


class Lines:
    "Fake keyboard input: the lines, then Ctrl-D (or an exception); records what was printed before each line."

    def __init__(self, *lines, end=EOFError):
        self.lines, self.end = list(lines), end

    def __call__(self, prompt: str) -> str:
        print(prompt, end="")
        if not self.lines:
            raise self.end
        line = self.lines.pop(0)
        print(line)
        return line


class Writes(io.StringIO):
    "sys.stdout that keeps each write apart: a reply printed piece by piece shows as several writes."

    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, s):
        self.writes.append(s)
        return super().write(s)


def test_chat_streams_drops_old_turns_and_refuses_what_cannot_fit(run, monkeypatch):
    out = Writes()
    monkeypatch.setattr(sys, "stdout", out)
    q = "What is 12 + 34?"
    chat_loop(run, max_new_tokens=8, temperature=0.0, read=Lines(q, "", "x" * 100, q, q))
    text = out.getvalue()
    assert text.count("model> ") == 3 and "dropped 2 old turns to fit the context of 64 tokens" in text
    assert "too long" in text and "shorten it" in text
    ck = load_checkpoint(run)
    ids = render([{"role": "user", "content": q}], ck.tokenizer, generation=True)[0]
    reply = expected(ck.model, ck.tokenizer, ids, 0, 8, temperature=0.0, stop=chat_ids(ck.tokenizer))
    first = text.split("model> ")[1].split("\nyou> ")[0]
    assert first == reply  # greedy: the first reply is generate's
    i = out.writes.index("model> ")
    assert len(out.writes[i : out.writes.index("\n", i)]) > 2, "the reply was printed in one piece"


def test_chat_survives_ctrl_c(run, capsys):
    ck_calls = {"n": 0}

    def interrupt(*_):
        ck_calls["n"] += 1
        if ck_calls["n"] == 3:  # the third token of the first reply
            raise KeyboardInterrupt

    from gptbook import checkpoint

    real = checkpoint.load_checkpoint

    def load(*a, **kw):
        ck = real(*a, **kw)
        ck.model.register_forward_pre_hook(interrupt)
        return ck

    import gptbook.serve

    mp = pytest.MonkeyPatch()
    mp.setattr(gptbook.serve, "load_checkpoint", load)
    try:
        chat_loop(run, max_new_tokens=8, read=Lines("What is 1 + 2?", "What is 3 + 4?", end=KeyboardInterrupt))
    finally:
        mp.undo()
    out = capsys.readouterr().out
    assert "[stopped]" in out and out.count("model> ") == 2 and out.endswith("you> \n")


def test_a_missing_server_library_is_one_line_naming_the_extra(run, monkeypatch):
    from gptbook.serve import serve

    for name, start in (("fastapi", create_app), ("uvicorn", serve)):
        with monkeypatch.context() as m:
            m.setitem(sys.modules, name, None)  # as if it were not installed
            with pytest.raises(ImportError, match=rf'needs {name}: pip install "gptbook\[serve\]"'):
                start(run)


def test_the_commands_run_in_a_real_process(run):
    "`gptbook chat` with lines on its input, and `gptbook serve`'s first lines, as a user runs them."
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    chat = subprocess.run([sys.executable, "-m", "gptbook", "chat", str(run), "--seed", "0"], input="What is 1 + 2?\n",
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert chat.returncode == 0 and chat.stdout.count("model> ") == 1, chat.stderr
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "gptbook", "serve", str(run), "--port", str(port)],
                             stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        first = serve.stdout.readline() + serve.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in first and "only this machine" in first, first
        for _ in range(100):
            try:
                models = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none").models.list()
                break
            except openai.APIConnectionError:
                time.sleep(0.1)
        assert models.data[0].id == "sft"
    finally:
        serve.terminate()
        serve.wait(10)
