"""The wheel installs and imports with its runtime requirements only (no nbdev, no fastcore)."""

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.slow
def test_wheel_installs_and_imports_without_dev_tools(tmp_path):
    dist = tmp_path / "dist"
    # --no-isolation: build with this environment's setuptools (no download of a build env)
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)], cwd=ROOT)
    wheels = list(dist.glob("gptbook-*.whl"))
    assert len(wheels) == 1, wheels

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    import torch

    # The same torch as here (this machine keeps its CPU build on disk), then the wheel, whose other
    # runtime requirements pip resolves from the wheel's own metadata.
    # cwd and environment away from the checkout: its gptbook.egg-info on sys.path ('' or PYTHONPATH) would make
    # pip think gptbook is installed already, and skip the wheel (and its console script)
    away = {"cwd": tmp_path, "env": {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}}
    _run([py, "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}"], **away)
    _run([py, "-m", "pip", "install", "-q", str(wheels[0])], **away)

    check = (
        "import importlib, importlib.util, pkgutil, gptbook\n"
        "for dev in ('nbdev', 'fastcore', 'execnb', 'matplotlib', 'pytest'):\n"
        "    assert importlib.util.find_spec(dev) is None, dev + ' should not be installed'\n"
        "mods = pkgutil.walk_packages(gptbook.__path__, 'gptbook.')\n"
        "names = [m.name for m in mods if m.name != 'gptbook.__main__']\n"
        "for name in names: importlib.import_module(name)\n"
        "assert 'gptbook.data' in names\n"
        "from gptbook.book.widgets import bpe_stepper\n"
        "assert 'fill: function' in bpe_stepper({}, [b'ab'])._repr_html_()  # the scripts are package data\n"
        "print(gptbook.__version__, len(names))\n"
    )
    out = _run([py, "-c", check], **away).stdout  # cwd outside the repo: import the installed wheel
    assert out.split()[0] == _version()
    if (ROOT / "gptbook" / "cli.py").exists():
        help_text = _run([env_dir / "bin" / "gptbook", "--help"]).stdout
        assert "train" in help_text and "sample" in help_text


def _version():
    import configparser

    cp = configparser.ConfigParser(delimiters=["="])
    cp.read(ROOT / "settings.ini")
    return cp["DEFAULT"]["version"]


def _extras(tmp_path) -> dict:
    "The extras setup.py declares, read back from the metadata it writes: {extra: {package names}}."
    _run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)], cwd=ROOT)
    extras, name = {}, None
    for line in (tmp_path / "gptbook.egg-info" / "requires.txt").read_text().splitlines():
        if line.startswith("["):
            name = line.strip("[]")
            extras[name] = set()
        elif line.strip() and name:
            extras[name].add(re.split(r"[<>=!~ ;]", line.strip())[0])
    return extras


def test_each_extra_brings_what_its_functions_import(tmp_path):
    "F5: every `optional(module, extra, ...)` in the package names an extra that installs `module`; [dev] has all."
    extras = _extras(tmp_path)
    calls = set()
    for path in (ROOT / "gptbook").rglob("*.py"):
        calls |= set(re.findall(r'optional\(\s*"([\w.]+)",\s*"(\w+)"', path.read_text()))
    assert {("tiktoken", "hf"), ("tokenizers", "hf")} <= calls, calls
    for module, extra in calls:
        assert module.split(".")[0] in extras[extra], (module, extra, extras)
    assert "huggingface_hub" in extras["hf"]  # gptbook.weights' hub lookup (its own message names [hf])
    assert extras["tensorboard"] == {"tensorboard"} and "matplotlib" in extras["plot"]
    assert set().union(*(extras[e] for e in ("hf", "tensorboard", "plot"))) <= extras["dev"]
    assert "transformers" in extras["dev"] and "transformers" not in extras["hf"]  # a test reference only
