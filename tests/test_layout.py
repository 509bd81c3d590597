"""The project's shape: site config, notebooks, README commands, CI workflows, dependency policy."""

import configparser
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
NOTEBOOKS = sorted(NBS.glob("*.ipynb"))
CHAPTERS = [p for p in NOTEBOOKS if re.match(r"\d\d_", p.name)]


def _settings():
    cp = configparser.ConfigParser(delimiters=["="])
    cp.read(ROOT / "settings.ini")
    return cp["DEFAULT"]


def _sidebar_entries(contents):
    "All notebook paths listed in a quarto sidebar `contents`, recursively through sections."
    out = []
    for item in contents or []:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and "section" in item:
            assert item.get("contents"), f"sidebar section {item['section']!r} is empty: quarto cannot render it"
            out += _sidebar_entries(item["contents"])
        elif isinstance(item, dict) and "href" in item:
            out.append(item["href"])
    return out


# --- site config ---------------------------------------------------------------------------------


def test_nbs_quarto_yml_is_a_symlink_to_the_root_file():
    link = NBS / "_quarto.yml"
    assert link.is_symlink(), "nbs/_quarto.yml must be a symlink (nbdev 2 reads the site config from nbs/)"
    assert os.readlink(link) == "../_quarto.yml"
    assert link.resolve() == (ROOT / "_quarto.yml").resolve()
    mode = subprocess.run(["git", "ls-files", "-s", "nbs/_quarto.yml"], cwd=ROOT, capture_output=True, text=True).stdout
    if mode:  # in a git checkout: committed as a link, not as a copy
        assert mode.startswith("120000"), mode


def test_sidebar_lists_exactly_the_notebooks():
    cfg = yaml.safe_load((ROOT / "_quarto.yml").read_text())
    listed = _sidebar_entries(cfg["website"]["sidebar"]["contents"])
    assert len(listed) == len(set(listed)), f"duplicate sidebar entries: {listed}"
    for entry in listed:
        assert (NBS / entry).is_file(), f"_quarto.yml's sidebar lists {entry}, which is not in nbs/"
    assert sorted(listed) == sorted(p.name for p in NOTEBOOKS), "every notebook must be in the sidebar"
    assert listed[0] == "index.ipynb"


def test_site_features():
    cfg = yaml.safe_load((ROOT / "_quarto.yml").read_text())
    assert cfg["project"]["type"] == "website"
    assert "nbdev.yml" in cfg["metadata-files"]
    html = cfg["format"]["html"]
    assert html["css"] == "styles.css" and (NBS / "styles.css").is_file()
    assert html["toc"] is True and "html-math-method" in html
    site = cfg["website"]
    assert site["page-navigation"] is True and site["sidebar"]["style"] == "docked"
    assert "search" in site


# --- notebooks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_front_matter_and_hygiene(nb_path):
    nb = json.loads(nb_path.read_text())
    assert nb["metadata"] == {"kernelspec": {"display_name": "python3", "language": "python", "name": "python3"}}, (
        "notebook metadata should be just the kernelspec (convert with jupytext --update-metadata, then nbdev_clean)"
    )
    first = nb["cells"][0]
    assert first["cell_type"] == "markdown"
    lines = [line for line in "".join(first["source"]).splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith("# ") and lines[1].startswith("> "), (
        "the first cell holds only '# Title' and '> summary' (nbdev turns it into front matter)"
    )
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("execution_count") is None, "run nbdev_clean"
        assert not cell.get("metadata"), "run nbdev_clean"


@pytest.mark.parametrize("nb_path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_shape(nb_path):
    nb = json.loads(nb_path.read_text())
    src = ["".join(c["source"]) for c in nb["cells"]]
    md = "\n".join(s for s, c in zip(src, nb["cells"]) if c["cell_type"] == "markdown")
    assert "## Summary" in md and "## Exercises" in md, "each chapter ends with a Summary and Exercises"
    if any("#| default_exp" in s for s in src):
        assert "nbdev_export()" in src[-1] and src[-1].lstrip().startswith("#| hide"), (
            "a chapter that exports ends with a hidden `import nbdev; nbdev.nbdev_export()` cell"
        )


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_page_opens_in_colab(nb_path):
    "Second cell: a link that opens this very notebook in Colab; third: a hidden cell that installs gptbook there only."
    nb = json.loads(nb_path.read_text())
    link, install = ("".join(c["source"]) for c in nb["cells"][1:3])
    s = _settings()
    repo = (
        s["git_url"].replace("%(user)s", s["user"]).replace("%(repo)s", s["repo"]).removeprefix("https://github.com/")
    )
    assert f"](https://colab.research.google.com/github/{repo}/blob/main/nbs/{nb_path.name})" in link
    assert install.startswith("#| hide\n") and '"google.colab" in str(get_ipython())' in install
    assert f"git+https://github.com/{repo}" in install


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_cells_have_outputs_saved(nb_path):
    "The site shows saved outputs: a notebook that prints or plots anything must have been executed."
    nb = json.loads(nb_path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    showing = [
        c
        for c in code
        if re.search(r"\bprint\(|plt\.|\.plot\(|display\(", "".join(c["source"]))
        and "#| notest" not in "".join(c["source"])
        and "#| cuda" not in "".join(c["source"])
    ]
    if showing:
        assert any(c.get("outputs") for c in showing), f"{nb_path.name} has no saved outputs: execute it"


# --- README and home page ------------------------------------------------------------------------


def _commands(text):
    "Shell commands in ```sh fences."
    blocks = re.findall(r"```(?:sh|bash)\n(.*?)```", text, flags=re.S)
    return [line.strip() for b in blocks for line in b.splitlines() if line.strip()]


def test_readme_and_index_show_the_same_commands():
    readme = _commands((ROOT / "README.md").read_text())
    nb = json.loads((NBS / "index.ipynb").read_text())
    index = _commands("\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"))
    for cmds in (readme, index):
        assert 'pip install -e ".[dev]"' in cmds
        assert "nbdev_test && pytest" in cmds
        assert "gptbook train" in cmds
    install = [c for c in readme if c.startswith("pip install")]
    test = [c for c in readme if "pytest" in c or "nbdev_test" in c]
    assert install == [c for c in index if c.startswith("pip install")]
    assert test == [c for c in index if "pytest" in c or "nbdev_test" in c]
    assert [c for c in readme if c.startswith("gptbook ")] == [c for c in index if c.startswith("gptbook ")]


def test_ci_runs_the_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = _commands((ROOT / "README.md").read_text())
    install = next(c for c in readme if c.startswith("pip install"))
    test = next(c for c in readme if "pytest" in c)
    assert install in ci and test in ci


# --- packaging and dependency policy -------------------------------------------------------------


def test_settings_pin_nbdev_2():
    s = _settings()
    dev = s["dev_requirements"].split()
    for pin in ("nbdev==2.4.14", "execnb<0.2", "fastcore<1.13", "ghapi<2"):
        assert pin in dev
    assert s["tst_flags"].split() == ["notest", "slow", "cuda"]
    assert s["min_python"] == "3.10" and s["license"] == "apache2"
    runtime = {re.split(r"[<>=!~ ]", r)[0] for r in s["requirements"].split()}
    assert runtime == {"torch", "numpy", "regex", "tqdm", "safetensors"}


def _modules():
    pkg = ROOT / "gptbook"
    return sorted(
        "gptbook." + ".".join(p.relative_to(pkg).with_suffix("").parts)
        for p in pkg.rglob("*.py")
        if p.name not in ("__init__.py", "_modidx.py", "__main__.py")
    )


def _import_with_blocked(modules, blocked):
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None  # any import of these now fails\n"
        f"import importlib\nfor m in {modules!r}: importlib.import_module(m)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_package_imports_without_dev_tools():
    "Only the runtime requirements may be imported at import time (optional ones lazily, inside functions)."
    blocked = [
        "nbdev",
        "fastcore",
        "execnb",
        "matplotlib",
        "tiktoken",
        "tokenizers",
        "transformers",
        "IPython",
        "pytest",
        "hypothesis",
        "yaml",
    ]
    r = _import_with_blocked(["gptbook"] + _modules(), blocked)
    assert r.returncode == 0, r.stderr[-2000:]


def test_scratch_mirror_never_imports_torch():
    scratch = [m for m in _modules() if m.startswith("gptbook.scratch.")]
    if not scratch:
        pytest.skip("no gptbook.scratch modules yet")
    r = _import_with_blocked(scratch, ["torch"])
    assert r.returncode == 0, r.stderr[-2000:]


# The module map: what each module may import from the package (imports point one way, function-level imports
# included). files and options are the leaves; the chapter modules import each other in chapter order; the
# engineering modules (checkpoint, runs, hf, cli) sit above them; nothing imports gptbook.book.
ALLOWED_IMPORTS = {
    "options": set(),
    "files": set(),
    "corpus": {"files"},  # Tiny Shakespeare found, checked and downloaded
    "tokenizer": {"files", "adapters"},
    "adapters": set(),  # theirs (tiktoken, Hugging Face) wrapped in the few methods gptbook calls
    "positions": {"options"},
    "attention": {"options", "positions"},
    "layers": {"options", "attention"},
    "config": {"options", "layers", "positions", "files"},
    "model": {"attention", "config", "layers", "positions", "weights", "hf"},  # weights: GPT.from_hf; hf: save_hf
    "weights": {"config", "positions"},  # reads nanoGPT and Hugging Face weights into our names; builds no model
    "data": {"adapters", "corpus", "tokenizer", "files"},
    "checkpoint": {"chat", "files", "config", "model", "tokenizer"},  # chat: a LoRA run's adapters merged on load
    "runs": {
        "chat",
        "checkpoint",
        "config",
        "corpus",
        "data",
        "faster",
        "hf",
        "files",
        "model",
        "options",
        "reward",
        "tokenizer",
    },
    "train": {"chat", "checkpoint", "config", "data", "faster", "model", "options", "reward", "runs"},
    "reward": {"chat", "model"},  # chapter 17: RL on chapter 16's tasks; train and runs use it
    "chat": {"corpus", "files", "sample", "tokenizer"},  # chapter 16: tasks, template, LoRA; train and runs use it
    "faster": set(),  # chapter 15's optimizer and matmul ceiling: torch only, so the trainer of chapter 8 can use them
    "sample": {"adapters", "options", "tokenizer"},  # duck-types the model: no model, no trainer
    "hf": {"config", "files", "model", "positions", "tokenizer", "weights"},
    "cli": {
        "chat",
        "checkpoint",
        "config",
        "files",
        "hf",
        "model",
        "options",
        "sample",
        "reward",
        "serve",
        "tokenizer",
        "runs",
        "train",
    },
    "inspect": {"positions", "attention"},  # hooks on the model's own layers; the attention-only model reuses them
    "serve": {"adapters", "chat", "checkpoint", "options", "sample"},  # chat and HTTP over chapter 16's template
}


def _package_imports(path: Path) -> tuple[set[str], set[str]]:
    "The gptbook modules `path` imports (relative or absolute): (at module level, anywhere)."
    import ast

    tree = ast.parse(path.read_text())
    top, anywhere = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            name = node.module if node.level else node.module.removeprefix("gptbook.")
            if node.level or node.module.startswith("gptbook."):
                anywhere.add(name)
                if node in tree.body:
                    top.add(name)
    return top, anywhere


def test_imports_point_one_way():
    for name, allowed in ALLOWED_IMPORTS.items():
        _, anywhere = _package_imports(ROOT / "gptbook" / f"{name}.py")
        assert anywhere <= allowed, f"gptbook.{name} imports {sorted(anywhere - allowed)}"
    found = {p.stem for p in (ROOT / "gptbook").glob("*.py")} - {"__init__", "__main__", "_modidx"}
    assert found == set(ALLOWED_IMPORTS), f"add {sorted(found - set(ALLOWED_IMPORTS))} to the module map"


BACK_EDGES = {("model", "hf")}  # GPT.save_hf, the method HF users expect, imports gptbook.hf when it is called


def test_no_import_circle_even_through_imports_inside_functions():
    "No circle, except through a back edge imported inside a function (never at the top of the module)."
    imports = {name: _package_imports(ROOT / "gptbook" / f"{name}.py") for name in ALLOWED_IMPORTS}
    assert all(b not in imports[a][0] for a, b in BACK_EDGES), "a back edge is imported at module level"
    graph = {name: {b for b in anywhere if (name, b) not in BACK_EDGES} for name, (_, anywhere) in imports.items()}
    done: set[str] = set()

    def visit(name, path):
        assert name not in path, f"import circle: {' -> '.join([*path, name])}"
        if name not in done:
            for dep in graph.get(name, ()):
                visit(dep, [*path, name])
            done.add(name)

    for name in graph:
        visit(name, [])


def test_nothing_in_the_library_imports_the_books_helpers():
    for path in (ROOT / "gptbook").rglob("*.py"):
        if "book" not in path.relative_to(ROOT / "gptbook").parts:
            _, anywhere = _package_imports(path)
            assert not any(m == "book" or m.startswith("book.") for m in anywhere), path


def test_sampling_and_the_tokenizer_load_only_what_they_need():
    "The tokenizer loads no torch; loading a checkpoint, sampling and the `gptbook sample` command load no trainer."
    code = (
        "import sys, gptbook.tokenizer\n"
        "assert 'torch' not in sys.modules, 'gptbook.tokenizer loaded torch'\n"
        "import gptbook.checkpoint, gptbook.sample, gptbook.hf, gptbook.cli\n"
        "from gptbook.cli import build_parser\n"
        "build_parser('sample').parse_args(['sample', 'out'])\n"
        "loaded = [m for m in ('gptbook.train', 'gptbook.runs') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]


# --- GitHub workflows ----------------------------------------------------------------------------


def _workflow(name):
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    # PyYAML reads the key `on` as the boolean True
    wf["on"] = wf.pop(True, wf.get("on"))
    return wf


def _run_lines(job):
    return "\n".join(step.get("run", "") for step in job["steps"])


def _uses(job):
    return [step.get("uses", "") for step in job["steps"]]


def test_test_workflow():
    wf = _workflow("test.yaml")
    assert {"push", "pull_request"} <= set(wf["on"])
    job = wf["jobs"]["test"]
    uses = _uses(job)
    assert any(u.startswith("actions/checkout@") for u in uses)
    assert any(u.startswith("actions/setup-python@") for u in uses)
    assert not any("fastai/workflows" in u for u in uses), "the stock fastai actions upgrade nbdev to 3.x"
    run = _run_lines(job)
    for needed in (
        'pip install -e ".[dev]"',
        "nbdev_clean",
        "nbdev_export",
        "git status --porcelain",
        "nbdev_test",
        "pytest",
        "ruff format --check .",
        "ruff check .",
    ):
        assert needed in run, needed


def test_ci_runs_the_ruff_gate():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ruff format --check ." in ci and "ruff check ." in ci
    conf = (ROOT / "pyproject.toml").read_text()
    assert "[tool.ruff]" in conf and "line-length = 120" in conf


def test_deploy_workflow():
    wf = _workflow("deploy.yaml")
    job = wf["jobs"]["deploy"]
    uses = _uses(job)
    assert any(u.startswith("quarto-dev/quarto-actions/setup@") for u in uses)
    assert any("deploy-pages" in u or "gh-pages" in u or "upload-pages-artifact" in u for u in uses)
    run = _run_lines(job)
    assert 'pip install -e ".[dev]"' in run and "nbdev_docs" in run


def test_release_workflow():
    wf = _workflow("release.yaml")
    assert "tags" in wf["on"]["push"]
    job = wf["jobs"]["release"]
    assert job["needs"] == "test" and wf["jobs"]["test"]["uses"] == "./.github/workflows/test.yaml", (
        "publish only after the test workflow passes"
    )
    assert "workflow_call" in _workflow("test.yaml")["on"]
    assert job["permissions"]["id-token"] == "write", "PyPI trusted publishing needs an OIDC token"
    assert any(u.startswith("pypa/gh-action-pypi-publish@") for u in _uses(job))
    assert "python -m build" in _run_lines(job)


def test_every_guarantee_of_the_checkpoints_appendix_names_a_test_that_exists():
    "Appendix A2 lists the run folder's guarantees with the tests that prove them: those tests must exist."
    import ast

    text = json.dumps(json.loads((ROOT / "nbs" / "A2_checkpoints.ipynb").read_text())["cells"])
    cited, file = [], None
    for m in re.finditer(r"(?:(test_\w+)\.py)?::(test_\w+)|`::(test_\w+)`", text):
        file = m.group(1) or file
        cited.append((file, m.group(2) or m.group(3)))
    assert len(cited) >= 10, cited
    for file, name in cited:
        tree = ast.parse((ROOT / "tests" / f"{file}.py").read_text())
        assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, f"{file}.py::{name}"


def _code_lines(node, lines, doc: set) -> int:
    "Lines of a definition that hold code: not blank, not a comment, not its docstring."
    span = range(node.lineno, node.end_lineno + 1)
    return sum(1 for i in span if i not in doc and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#"))


def test_no_function_is_longer_than_a_screen():
    "At most 40 code lines a function (docstrings and comments aside), across the package."
    import ast

    too_long = []
    for path in sorted((ROOT / "gptbook").rglob("*.py")):
        src = path.read_text()
        tree, lines = ast.parse(src), src.splitlines()
        doc = set()
        for n in ast.walk(tree):
            body = getattr(n, "body", None)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and body:
                first = body[0]
                if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
                    doc |= set(range(first.lineno, first.end_lineno + 1))
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(n, lines, doc) > 40:
                too_long.append(f"{path.relative_to(ROOT)}:{n.lineno} {n.name} ({_code_lines(n, lines, doc)})")
    assert not too_long, too_long


def test_no_exported_cell_is_longer_than_120_lines():
    "A chapter shows its library code in cells a reader can take in: at most 120 lines each."
    long_cells = []
    for nb in sorted((ROOT / "nbs").rglob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "code" and re.search(r"^#\|\s*exports?\b", src, re.M):
                n = sum(1 for line in src.splitlines() if line.strip() and not line.startswith("#|"))
                if n > 120:
                    long_cells.append(f"{nb.name} {cell['id']} ({n} lines)")
    assert not long_cells, long_cells


HIDDEN = re.compile(r"^#\|\s*(hide|export|code-fold:\s*true|echo:\s*false)\s*$|^#\|\s*export \w", re.M)


@pytest.mark.parametrize("nb_path", CHAPTERS, ids=lambda p: p.stem)
def test_teaching_cells_fit_an_80_column_page(nb_path):
    "Code a chapter shows open to teach (a def or class, not the exported package code) fits 80 columns."
    wide = []
    for cell in json.loads(nb_path.read_text())["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or HIDDEN.search(src) or re.search(r"^#\|\s*exports", src, re.M):
            continue
        if re.search(r"^(def|class) ", src, re.M):
            wide += [f"{cell['id']}: {len(line)}" for line in src.splitlines() if len(line) > 80]
    assert not wide, wide
