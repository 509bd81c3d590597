"""The website as Quarto rendered it (`_docs/`, from `nbdev_docs`), in a real browser.

`.ci/run` renders the site with Quarto and sets $GPTBOOK_SITE_DOCS, which makes this module fail rather than skip
when the site is missing. A plain `pytest` with no `_docs/` (or one older than the notebooks) skips it.

The pages are served from 127.0.0.1. Every request for another host is answered from a local copy or refused:
- jsDelivr's npm files (KaTeX, and the require.js and jQuery that Quarto adds to pages with HTML outputs) come from
  npm packages of the same versions in $GPTBOOK_SITE_ASSETS (`.ci/run` installs them with npm). Only for a file that
  jsDelivr minifies on the fly (require.min.js: npm has the unminified require.js) is the page's integrity hash
  dropped, since no local file can have those bytes;
- Google Fonts (the theme's web fonts) get an empty stylesheet: the page falls back to the system's fonts;
- anything else is refused, and a page that asks for it fails.

The pages are the sidebar's, read from the rendered home page; what each page should hold (folded cells, plots,
widgets) is read from its notebook, found through the page's "View source" link. Each page is loaded once; the
tests below assert on what that visit measured. Screenshots go to .cache/site/ (not committed) for a person."""

import html.parser
import http.server
import json
import mimetypes
import os
import re
import threading
import urllib.parse
from functools import cache, partial
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = Path(os.environ.get("GPTBOOK_SITE_DOCS") or ROOT / "_docs")
REQUIRED = bool(os.environ.get("GPTBOOK_SITE_DOCS"))  # .ci/run: a missing site is a failure, not a skip
_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
ASSETS = Path(os.environ.get("GPTBOOK_SITE_ASSETS") or _CACHE / "gptbook-site" / "npm")
SHOTS = ROOT / ".cache" / "site"
WIDE, NARROW = 1280, 375
JSDELIVR = re.compile(r"https://cdn\.jsdelivr\.net/npm/((?:@[^/@\s\"]+/)?[^/@\s\"]+)@([^/\s\"]+)/([^?#\s\"]+)")
FONT_HOSTS = ("https://fonts.googleapis.com/", "https://fonts.gstatic.com/")
NPM_INSTALL = "npm install --prefix {} --no-save {}  (.ci/run does this)"


def _why_skip() -> str | None:
    index = DOCS / "index.html"
    if not index.is_file():
        return f"no rendered site at {DOCS}: nbdev_docs renders it (Quarto: ../shared/tools/quarto); .ci/run does"
    sources = [*ROOT.glob("nbs/*.ipynb"), ROOT / "_quarto.yml", ROOT / "nbs" / "styles.css"]
    if not REQUIRED and max(p.stat().st_mtime for p in sources) > index.stat().st_mtime:
        return f"the site in {DOCS} is older than the notebooks: run nbdev_docs again"
    return None


if _reason := _why_skip():
    if REQUIRED:
        raise RuntimeError(_reason)
    pytest.skip(_reason, allow_module_level=True)

# The browser: the widget tests' Chromium (Debian's, or $GPTBOOK_CHROMIUM) and their `browser` fixture.
from test_widgets import browser  # noqa: E402, F401

pytestmark = pytest.mark.slow


# --- the site's files, read without a browser ------------------------------------------------------------


class _Html(html.parser.HTMLParser):
    "The ids, links, sidebar entries and page actions ('View source') of one page."

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.ids, self.links, self.sidebar, self.actions, self._in_body = [], [], [], [], False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._in_body |= tag == "body"
        if self._in_body and a.get("id"):
            self.ids.append(a["id"])
        for key in ("href", "src"):
            if a.get(key) and tag in ("a", "img", "link", "script", "source", "iframe"):
                self.links.append(a[key])
        if tag == "a" and "sidebar-link" in (a.get("class") or "") and a.get("href"):
            self.sidebar.append(a["href"])
        if tag == "a" and "toc-action" in (a.get("class") or "") and a.get("href"):
            self.actions.append(a["href"])


def _text(page: str) -> str:
    return (DOCS / page).read_text(encoding="utf-8")


@cache
def _parsed(page: str) -> _Html:
    return _Html(_text(page))


def _sidebar_pages() -> list[str]:
    "The pages of the rendered sidebar, in order, as paths inside the site."
    return [urllib.parse.urljoin("index.html", h).split("#")[0] for h in _parsed("index.html").sidebar]


PAGES = _sidebar_pages()
SITE = yaml.safe_load((ROOT / "nbs" / "nbdev.yml").read_text())["website"]
REPO = SITE["repo-url"].rstrip("/") + "/blob/" + SITE.get("repo-branch", "main") + "/"


def _source_link(page: str) -> str | None:
    "The page's 'View source' link (Quarto's `repo-actions`)."
    return next((h for h in _parsed(page).actions if h.startswith(REPO) and h.endswith(".ipynb")), None)


def _notebook(page: str) -> Path:
    "The notebook a page was rendered from: its 'View source' link."
    link = _source_link(page)
    assert link, f"{page}: no 'View source' link to {REPO}..."
    return ROOT / link[len(REPO) :]


def _directives(source: str) -> dict:
    "nbdev/Quarto cell options: `#| code-fold: true` -> {'code-fold': 'true'}, `#| exports x` -> {'exports': 'x'}."
    found = {}
    for line in source.splitlines():
        if m := re.match(r"#\|\s*([\w-]+):?\s*(.*)", line):
            found[m[1]] = m[2].strip().lower()
    return found


@cache
def _expected(page: str) -> dict:
    "What the notebook says the page shows: folded cells, saved images, widget ids."
    nb = json.loads(_notebook(page).read_text(encoding="utf-8"))
    folds, images, widgets = 0, 0, []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        d = _directives("".join(cell["source"]))
        if d.keys() & {"export", "exporti", "hide", "default_exp"} or d.get("include") == "false":
            continue  # the cell is not on the page
        folds += d.get("code-fold") == "true" and d.get("echo") != "false"
        if d.get("output") == "false":
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            images += any(k.startswith("image/") for k in data)
            widgets += re.findall(r'<div class="gbw" id="([^"]+)"', "".join(data.get("text/html", "")))
    return dict(folds=folds, images=images, widgets=widgets)


def _local_copy(url: str) -> tuple[Path, bool] | None:
    "(file, exact) standing in for a jsDelivr npm URL: the package at that version from ASSETS, else None."
    m = JSDELIVR.match(url)
    if not m:
        return None
    name, version, path = m.groups()
    package = ASSETS / "node_modules" / name
    try:
        if json.loads((package / "package.json").read_text())["version"] != version:
            return None
    except (OSError, ValueError, KeyError):
        return None
    if (package / path).is_file():
        return package / path, True
    if path.endswith(".min.js") and (package / (path[: -len(".min.js")] + ".js")).is_file():
        return package / (path[: -len(".min.js")] + ".js"), False  # jsDelivr minifies this one itself
    return None


def _drop_stand_in_hashes(text: str) -> str:
    "Remove the integrity hash of scripts whose local copy cannot match it (see the module's docstring)."

    def fix(m):
        src = re.search(r'\bsrc="([^"]+)"', m[0])
        copy = src and _local_copy(src[1])
        return re.sub(r'\s+integrity="[^"]*"', "", m[0]) if copy and not copy[1] else m[0]

    return re.sub(r"<script\b[^>]*>", fix, text)


# --- the site as a whole ---------------------------------------------------------------------------------


def _quarto_sidebar_notebooks() -> list[str]:
    config = yaml.safe_load((ROOT / "_quarto.yml").read_text())

    def walk(items):
        for item in items:
            if isinstance(item, str):
                yield item
            elif isinstance(item, dict):
                yield from ([item["href"]] if "href" in item else [])
                yield from walk(item.get("contents", []))

    return [n for n in walk(config["website"]["sidebar"]["contents"]) if n.endswith(".ipynb")]


def test_the_sidebar_holds_every_notebook_of_quarto_yml_in_order():
    notebooks = _quarto_sidebar_notebooks()
    assert PAGES and len(PAGES) == len(set(PAGES)) == len(notebooks), (PAGES, notebooks)
    shown = [str(_notebook(p).relative_to(ROOT / "nbs")) for p in PAGES]
    assert shown == notebooks, "each sidebar entry is the page of the notebook _quarto.yml names there"


def test_only_the_sidebar_pages_are_published():
    "The stub notebooks (nbs/stubs, nbs/scratch) make modules, not pages: no page, no search entry, no sitemap line."
    published = sorted(
        str(p.relative_to(DOCS))
        for p in DOCS.rglob("*.html")
        if not {"site_libs"} & set(p.relative_to(DOCS).parts) and not p.parent.name.endswith("_files")
    )
    assert published == sorted(PAGES)
    searched = {e["href"].split("#")[0] for e in json.loads(_text("search.json"))}
    assert searched == set(PAGES), searched ^ set(PAGES)
    located = re.findall(r"<loc>([^<]+)</loc>", _text("sitemap.xml"))
    base = SITE["site-url"].rstrip("/") + "/"
    assert sorted(loc.removeprefix(base) for loc in located) == sorted(PAGES)


def test_no_page_is_published_as_a_second_format():
    "HTML only (see _quarto.yml): no CommonMark copies and no 'Other Formats' links."
    assert not list(DOCS.rglob("*.html.md"))
    assert not [p for p in PAGES if "quarto-alternate-formats" in _text(p)]


@pytest.mark.parametrize("page", PAGES)
def test_every_internal_link_and_anchor_resolves(page):
    broken = []
    for link in _parsed(page).links:
        parts = urllib.parse.urlsplit(link)
        if parts.scheme or link.startswith("//") or link in ("", "#"):
            continue
        target = urllib.parse.urljoin(page, parts.path) if parts.path else page
        if not (DOCS / target).is_file():
            broken.append(f"{link}: no file {target}")
        elif parts.fragment and target.endswith(".html"):
            if urllib.parse.unquote(parts.fragment) not in _parsed(target).ids:
                broken.append(f"{link}: {target} has no id {parts.fragment!r}")
    assert not broken, f"{page}: " + "; ".join(broken)
    ids = _parsed(page).ids
    assert len(ids) == len(set(ids)), f"{page}: ids used twice: {sorted({i for i in ids if ids.count(i) > 1})}"


@pytest.mark.parametrize("page", PAGES)
def test_links_into_the_repository_name_files_that_exist(page):
    "'View source', 'Open in Colab' and the API docs' source links point at files of this checkout (nbs/ included)."
    repo_path = re.compile(re.escape(SITE["repo-url"].removeprefix("https://github.com/")) + r"/blob/[^/]+/([^#?]+)")
    targets = [m[1] for link in _parsed(page).links if "github" in link and (m := repo_path.search(link))]
    assert _source_link(page) and _source_link(page).startswith(REPO + "nbs/")
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"{page} links to files of the repository that do not exist: {missing}"


def test_cdn_files_are_pinned_and_copied_locally():
    "Every jsDelivr file a page loads names an exact version (no @latest), and ASSETS holds it for the browser."
    urls = {m[0] for p in PAGES for m in JSDELIVR.finditer(_text(p))}
    assert any("/katex@" in u for u in urls), "the pages load KaTeX"
    unpinned = sorted(u for u in urls if not re.fullmatch(r"\d+\.\d+\.\d+", JSDELIVR.match(u)[2]))
    assert not unpinned, f"unpinned: {unpinned}"
    missing = sorted({f"{JSDELIVR.match(u)[1]}@{JSDELIVR.match(u)[2]}" for u in urls if not _local_copy(u)})
    assert not missing, "no local copy of " + ", ".join(missing) + ": " + NPM_INSTALL.format(ASSETS, " ".join(missing))


# --- each page in Chromium --------------------------------------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(DOCS)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


MATHS = """() => {
  const spans = [...document.querySelectorAll('span.math')];
  return {total: spans.length,
          raw: spans.filter(s => !s.querySelector('.katex')).map(s => s.textContent.slice(0, 80)),
          errors: [...document.querySelectorAll('.katex-error')].map(e => e.textContent.slice(0, 80)),
          version: window.katex ? window.katex.version : null};
}"""

# Paths of the machine that ran a notebook (its temporary folders, home, checkout, installed packages)
MACHINE_PATH = (
    r"(?:/tmp/|/var/folders/|/private/var/|/home/|/root/|/work/|/Users/|[A-Z]:\\Users\\)[^\s'\"<>),]*"
    r"|site-packages"
)

CONTENT = """async (machinePath) => {
  const imgs = [...document.querySelectorAll('main img')];
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  const opaque = img => {
    if (!img.naturalWidth) return null;
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext('2d');
    g.drawImage(img, 0, 0);
    const corners = [[0, 0], [c.width - 1, 0], [0, c.height - 1], [c.width - 1, c.height - 1]];
    return corners.every(([x, y]) => g.getImageData(x, y, 1, 1).data[3] === 255);
  };
  return {
    folds: [...document.querySelectorAll('details.code-fold')].map(d => d.open),
    outputFolds: [...document.querySelectorAll('main details.output-fold')].map(d => d.open),
    otherDetails: document.querySelectorAll('main details:not(.code-fold):not(.output-fold)').length,
    images: imgs.map(i => ({src: i.getAttribute('src'), loaded: i.complete && i.naturalWidth > 0,
                            output: !!i.closest('.cell-output-display'), opaque: opaque(i)})),
    widgets: [...document.querySelectorAll('.gbw[id]')].map(w => w.id),
    machinePaths: [...document.querySelectorAll('.cell-output')]
      .flatMap(e => e.textContent.match(new RegExp(machinePath, 'g')) || []),
    live: document.querySelectorAll('.gbw.gbw-live').length,
  };
}"""

LAYOUT = """() => {
  const box = e => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
                                                                   bottom: r.bottom}; };
  return {
    width: window.innerWidth,
    scrollWidth: document.documentElement.scrollWidth,
    columns: [...document.querySelectorAll('div.columns')].map(c =>
      [...c.querySelectorAll(':scope > div.column')].map(col => ({...box(col),
        code: col.querySelectorAll('pre').length}))),
    panels: [...document.querySelectorAll('.quarto-layout-panel .quarto-layout-row')].map(r =>
      [...r.children].map(cell => ({...box(cell), empty: !cell.textContent.trim() && !cell.querySelector('img')}))),
    wideOutputs: [...document.querySelectorAll('.cell-output pre')]
      .filter(p => p.scrollWidth > p.clientWidth + 1).map(p => p.textContent.slice(0, 80)),
  };
}"""

READABLE = """() => {
  const rgba = s => { const m = s.match(/[\\d.]+/g) || ['0', '0', '0', '0'];
                      return m.map(Number).concat(m.length === 3 ? [1] : []); };
  const linear = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const lum = ([r, g, b]) => 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b);
  const over = (top, bottom) => top.slice(0, 3).map((v, i) => v * top[3] + bottom[i] * (1 - top[3])).concat([1]);
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) { layers.push(c); if (c[3] === 1) break; }
    }
    return layers.reverse().reduce((acc, c) => over(c, acc), [255, 255, 255, 1]);
  };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const low = [];
  for (const el of document.querySelectorAll('.gbw *')) {
    const own = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
    const r = el.getBoundingClientRect();
    if (!own || !r.width || getComputedStyle(el).visibility === 'hidden') continue;
    const needed = /[\\p{L}\\p{N}]/u.test(own) ? 4.5 : 3;  // words 4.5:1; a glyph alone (a legend's line) 3:1
    const style = getComputedStyle(el);
    const ink = el instanceof SVGElement ? rgba(style.fill) : rgba(style.color);
    const bg = background(el instanceof SVGElement ? el.closest('svg') : el);
    const c = ratio(over(ink, bg), bg);
    const what = `${el.tagName.toLowerCase()}.${el.getAttribute('class') || ''}`;
    if (c < needed) low.push(`${what} "${el.textContent.trim().slice(0, 30)}": ${c.toFixed(2)}`);
  }
  return {dark: document.body.classList.contains('quarto-dark'), low};
}"""

RESTORE = """(el, value) => { el.value = value; for (const kind of ['input', 'change'])
  el.dispatchEvent(new Event(kind, {bubbles: true})); }"""
WIDGET_STATE = """id => [...document.getElementById(id).querySelectorAll('.gbw-figure, .gbw-status')]
  .map(e => e.innerHTML).join('|')"""


def _controls_respond(page, wid: str) -> tuple[list, int]:
    """Work each slider (to both ends) and select of widget `wid`, each from the widget's first state, then its
    buttons: (the controls that changed nothing on the widget's figure and status, the number of buttons)."""
    root, dead = page.locator(f"#{wid}"), []
    state = lambda: page.evaluate(WIDGET_STATE, wid)  # noqa: E731
    for i in range(root.locator("input[type=range]").count()):
        control, before = root.locator("input[type=range]").nth(i), state()
        start = control.input_value()
        control.focus()
        page.keyboard.press("End")
        moved = state() != before
        page.keyboard.press("Home")
        if not (moved or state() != before):
            dead.append(f"slider {control.get_attribute('name')}")
        control.evaluate(RESTORE, start)
    for i in range(root.locator("select").count()):
        control, before = root.locator("select").nth(i), state()
        n, start = control.locator("option").count(), control.input_value()
        control.select_option(index=(control.evaluate("s => s.selectedIndex") + 1) % n)
        if n > 1 and state() == before:
            dead.append(f"select {control.get_attribute('name')}")
        control.evaluate(RESTORE, start)
    buttons, changed = root.locator("button"), False
    for i in range(buttons.count()):
        before = state()
        buttons.nth(i).click()
        changed |= state() != before
    if buttons.count() and not changed:
        dead.append("every button")
    return dead, buttons.count()


def _shots() -> dict:
    "The home page and three chapters to photograph: the first with side-by-side code, with a widget, with a plot."
    chosen = {"index.html": None}
    for marker in ('class="columns', 'class="gbw"', "figure-html/"):
        page = next((p for p in PAGES if p not in chosen and marker in _text(p)), None)
        page = page or next((p for p in PAGES if p not in chosen), None)
        chosen[page] = marker
    return chosen


SHOT_PAGES = _shots()


def _screenshot(page, name: str, marker: str | None, suffix: str):
    SHOTS.mkdir(parents=True, exist_ok=True)
    stem = name.removesuffix(".html").replace("/", "_")
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=SHOTS / f"{stem}-{suffix}.png")
    selector = {'class="columns': "div.columns", 'class="gbw"': ".gbw", "figure-html/": "main img"}.get(marker)
    if selector and suffix == "wide" and page.locator(selector).count():
        page.locator(selector).first.scroll_into_view_if_needed()
        page.screenshot(path=SHOTS / f"{stem}-{suffix}-{selector.split('.')[-1].split(' ')[-1]}.png")


_VISITS: dict = {}


@pytest.fixture(scope="module")
def visit(browser, server):  # noqa: F811 (the fixture imported from test_widgets)
    "Load a page once (wide and light, then narrow, then dark) and keep what was measured."

    def load(name: str) -> dict:
        if name in _VISITS:
            return _VISITS[name]
        context = browser.new_context(viewport={"width": WIDE, "height": 900})
        page, errors, refused, fonts = context.new_page(), [], [], []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

        def route(r):
            url = r.request.url
            if url.startswith(server):
                if urllib.parse.urlsplit(url).path.endswith((".html", "/")):
                    response = r.fetch()
                    return r.fulfill(response=response, body=_drop_stand_in_hashes(response.text()))
                return r.continue_()
            if copy := _local_copy(url):
                kind = mimetypes.guess_type(copy[0].name)[0] or "application/octet-stream"
                return r.fulfill(body=copy[0].read_bytes(), content_type=kind,
                                 headers={"Access-Control-Allow-Origin": "*"})  # fmt: skip
            if url.startswith(FONT_HOSTS):
                fonts.append(url)
                return r.fulfill(body="", content_type="text/css")
            refused.append(url)
            return r.abort()

        context.route("**/*", route)
        record = {}
        try:
            page.goto(server + name, wait_until="load")
            try:
                page.wait_for_function("() => [...document.querySelectorAll('span.math')].every("
                                       "s => s.querySelector('.katex, .katex-error'))", timeout=15_000)  # fmt: skip
            except Exception:  # measured below
                pass
            record["maths"] = page.evaluate(MATHS)
            record["content"] = page.evaluate(CONTENT, MACHINE_PATH)
            record["wide"] = page.evaluate(LAYOUT)
            record["light"] = page.evaluate(READABLE)
            if name in SHOT_PAGES:
                _screenshot(page, name, SHOT_PAGES[name], "wide")
            record["widgets"] = {w: _controls_respond(page, w) for w in record["content"]["widgets"]}
            page.set_viewport_size({"width": NARROW, "height": 800})
            page.wait_for_timeout(100)
            record["narrow"] = page.evaluate(LAYOUT)
            if name in SHOT_PAGES:
                _screenshot(page, name, None, "narrow")
            page.set_viewport_size({"width": WIDE, "height": 900})
            page.evaluate("window.quartoToggleColorScheme()")
            page.wait_for_timeout(100)
            record["dark"] = page.evaluate(READABLE)
            if name in SHOT_PAGES:
                _screenshot(page, name, None, "dark")
        finally:
            context.close()
        record.update(errors=errors, refused=refused, fonts=fonts)
        _VISITS[name] = record
        return record

    return load


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_with_no_javascript_error_and_no_outside_request(visit, page):
    v = visit(page)
    assert not v["errors"], f"{page}: {v['errors']}"
    assert not v["refused"], f"{page} asked for files that have no local copy: {v['refused']}"


@pytest.mark.parametrize("page", PAGES)
def test_every_maths_span_typesets(visit, page):
    maths, pinned = visit(page)["maths"], re.search(r"katex@([\d.]+)", (ROOT / "_quarto.yml").read_text())
    assert not maths["raw"], f"{page}: {len(maths['raw'])} maths spans left as TeX, e.g. {maths['raw'][:3]}"
    assert not maths["errors"], f"{page}: KaTeX errors: {maths['errors'][:5]}"
    if maths["total"]:
        assert pinned and maths["version"] == pinned[1], "the KaTeX that _quarto.yml pins is the one that typeset"


@pytest.mark.parametrize("page", PAGES)
def test_code_folds_are_the_notebooks_and_closed(visit, page):
    "A `#| code-fold: true` cell is folded and closed, so is a long output drawn as `output-fold`; nothing else."
    content = visit(page)["content"]
    assert len(content["folds"]) == _expected(page)["folds"], f"{page}: folded blocks against code-fold cells"
    assert not any(content["folds"]), f"{page}: a folded cell is open"
    assert not any(content["outputFolds"]), f"{page}: a folded output is open"
    assert content["otherDetails"] == 0, f"{page}: folded blocks that are neither code-fold cells nor folded outputs"


@pytest.mark.parametrize("page", PAGES)
def test_saved_plots_and_widgets_are_on_the_page(visit, page):
    content, expected = visit(page)["content"], _expected(page)
    outputs = [i for i in content["images"] if i["output"]]
    assert len(outputs) == expected["images"], f"{page}: images on the page against image outputs saved"
    assert not [i["src"] for i in content["images"] if not i["loaded"]], f"{page}: images that do not load"
    assert content["widgets"] == expected["widgets"], f"{page}: widgets on the page against those saved"
    assert content["live"] == len(expected["widgets"]), f"{page}: every widget's script ran"


@pytest.mark.parametrize("page", [p for p in PAGES if _expected(p)["widgets"]])
def test_every_widget_responds_to_its_controls(visit, page):
    widgets = visit(page)["widgets"]
    assert widgets, f"{page}: its notebook saved widgets, the page shows none"
    dead = {w: d for w, (d, _) in widgets.items() if d}
    assert not dead, f"{page}: controls that changed nothing: {dead}"


@pytest.mark.parametrize("page", PAGES)
def test_no_saved_output_shows_a_path_of_the_machine_that_ran_it(visit, page):
    "A temporary, home or checkout folder in a printed output changes with every run and means nothing to a reader."
    paths = visit(page)["content"]["machinePaths"]
    assert not paths, f"{page}: outputs show paths of the machine that ran the notebook: {sorted(set(paths))}"


def _side_by_side(row: list) -> bool:
    return all(abs(a["top"] - b["top"]) < 2 and b["left"] >= a["right"] - 1 for a, b in zip(row, row[1:]))


def _stacked(row: list) -> bool:
    return all(b["top"] >= a["bottom"] - 1 for a, b in zip(row, row[1:]))


@pytest.mark.parametrize("page", PAGES)
def test_side_by_side_blocks_are_side_by_side_wide_and_stack_narrow(visit, page):
    wide, narrow = visit(page)["wide"], visit(page)["narrow"]
    for row in wide["columns"]:
        assert len(row) >= 2 and all(col["code"] for col in row), f"{page}: a column without its code: {row}"
        assert _side_by_side(row), f"{page}: columns not side by side at {WIDE} px: {row}"
    for row in wide["panels"]:
        assert row and not any(cell["empty"] for cell in row), f"{page}: an empty layout panel"
        assert _side_by_side(row), f"{page}: a layout panel not side by side at {WIDE} px: {row}"
    for row in narrow["columns"] + narrow["panels"]:
        assert _stacked(row), f"{page}: side-by-side blocks not stacked at {NARROW} px: {row}"


@pytest.mark.parametrize("page", PAGES)
def test_nothing_scrolls_sideways(visit, page):
    "Neither the page (at 375 px) nor a printed output (at either width) scrolls sideways: long lines wrap."
    wide, narrow = visit(page)["wide"], visit(page)["narrow"]
    assert narrow["scrollWidth"] <= NARROW, f"{page} is {narrow['scrollWidth']} px wide on a {NARROW} px screen"
    assert not wide["wideOutputs"], f"{page}: outputs that scroll sideways: {wide['wideOutputs'][:3]}"
    assert not narrow["wideOutputs"], f"{page}: outputs that scroll sideways: {narrow['wideOutputs'][:3]}"


@pytest.mark.parametrize("page", PAGES)
def test_widgets_and_plots_stay_readable_in_the_light_and_dark_themes(visit, page):
    "Widget text keeps 4.5:1 contrast (a lone glyph 3:1) on either theme; plots keep their own opaque background."
    v = visit(page)
    assert v["dark"]["dark"] and not v["light"]["dark"], "the colour-scheme toggle turns the page dark"
    for theme in ("light", "dark"):
        assert not v[theme]["low"], f"{page}: widget text hard to read on the {theme} theme: {v[theme]['low'][:5]}"
    see_through = [i["src"] for i in v["content"]["images"] if i["output"] and i["opaque"] is False]
    assert not see_through, f"{page}: transparent plots (dark ink on the dark page): {see_through}"


def test_screenshots_for_a_person(visit):
    for page in SHOT_PAGES:
        visit(page)
    shots = sorted(p.name for p in SHOTS.glob("*.png"))
    stems = [p.removesuffix(".html").replace("/", "_") for p in SHOT_PAGES]
    assert all(f"{s}-{k}.png" in shots for s in stems for k in ("wide", "narrow", "dark")), shots
    print(f"screenshots of {', '.join(SHOT_PAGES)} in {SHOTS}")
