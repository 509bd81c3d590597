"""README.md is written by hand: nbdev's README generation (nbdev_readme, nbdev_prepare, nbdev_docs) cannot touch it.

settings.ini's readme_nb names a notebook that does not exist (nbdev 2.4.14 renders `nbs/<readme_nb>` into README.md;
left out, readme_nb defaults to index.ipynb, and left empty it names the nbs/ folder itself)."""

from pathlib import Path

import pytest

nbdev_config = pytest.importorskip("nbdev.config")
nbdev_quarto = pytest.importorskip("nbdev.quarto")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cfg(monkeypatch):
    "nbdev's config of this repository, read as nbdev reads it (settings.ini above the working directory)."
    monkeypatch.chdir(ROOT)
    nbdev_config.get_config.cache_clear()
    yield nbdev_config.get_config()
    nbdev_config.get_config.cache_clear()


def test_readme_nb_names_no_notebook(cfg):
    assert cfg.readme_nb.endswith(".ipynb") and cfg.readme_nb != "index.ipynb"
    assert not (cfg.nbs_path / cfg.readme_nb).exists()
    assert "README.md is written by hand" in (ROOT / "settings.ini").read_text()


@pytest.fixture
def no_render(monkeypatch, tmp_path):
    "nbdev_readme with its notebook processing replaced by a cache holding every notebook's name (empty files)."
    reached = []

    def proc_nbs(path):
        reached.append(path)
        for nb in Path(path).glob("*.ipynb"):
            (tmp_path / nb.name).touch()
        return tmp_path

    monkeypatch.setattr(nbdev_quarto, "proc_nbs", proc_nbs)
    return reached


def test_nbdev_prepare_and_docs_skip_the_readme(cfg, no_render, capsys):
    "nbdev_prepare and nbdev_docs call nbdev_readme(chk_time=True): it stops before processing anything."
    before = (ROOT / "README.md").read_bytes()
    nbdev_quarto.nbdev_readme.__wrapped__(chk_time=True)
    assert no_render == [] and "Could not find" in capsys.readouterr().out
    assert (ROOT / "README.md").read_bytes() == before


def test_a_plain_nbdev_readme_fails_before_writing(cfg, no_render, monkeypatch, tmp_path):
    "Without chk_time, quarto is asked to render a notebook that is not in the cache: it fails, README.md is untouched."
    commands = []
    real_sprun = nbdev_quarto._sprun

    def sprun(cmd):
        commands.append(cmd)
        real_sprun(cmd)

    monkeypatch.setattr(nbdev_quarto, "_sprun", sprun)
    monkeypatch.setenv("PATH", "/nonexistent")  # no quarto here; where there is one, the missing notebook fails it
    before = (ROOT / "README.md").read_bytes()
    with pytest.raises(SystemExit):
        nbdev_quarto.nbdev_readme.__wrapped__()
    assert no_render and (ROOT / "README.md").read_bytes() == before
    target = tmp_path / cfg.readme_nb
    assert [f'quarto render "{target}"' in c for c in commands] == [True] and not target.exists()
