"""Shared pytest set-up: find Tiny Shakespeare the way CI and the developers' machines have it."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"

# CI (and a developer's checkout) keeps the corpus beside the repo, in ../shared/data. A user's own
# GPTBOOK_DATA wins; without either, tests that need the text skip with the reason below.
if not os.environ.get("GPTBOOK_DATA") and SHARED_DATA.is_file():
    os.environ["GPTBOOK_DATA"] = str(SHARED_DATA)


def _data_file():
    value = os.environ.get("GPTBOOK_DATA")
    if not value:
        return None
    p = Path(value)
    p = p / "tinyshakespeare.txt" if p.is_dir() else p
    return p if p.is_file() else None


@pytest.fixture(scope="session")
def shakespeare_path():
    "Path of tinyshakespeare.txt, or skip the test saying how to supply it."
    p = _data_file()
    if p is None:
        pytest.skip(
            "Tiny Shakespeare not found: set GPTBOOK_DATA=/path/to/tinyshakespeare.txt "
            "(or keep it at ../shared/data/ beside the repo)"
        )
    return p


@pytest.fixture(scope="session")
def shakespeare(shakespeare_path):
    "The text of Tiny Shakespeare (skips when it is absent)."
    return shakespeare_path.read_text(encoding="utf-8")


@pytest.fixture
def one_thread():
    """One torch thread for the duration of a test, restored after: the tests run tiny models, for which a
    second OpenMP thread only adds synchronisation, and on a busy 2-core machine it can make a step many
    times slower. Modules that need it everywhere say `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
