from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
CORPORA = SHARED / "corpora"


@pytest.fixture(scope="session")
def shared_corpora() -> Path:
    """`../shared/corpora`; tests that need real text skip with a reason when it is absent."""
    if not CORPORA.is_dir():
        pytest.skip(f"real-text corpora not found at {CORPORA} (they live in ../shared beside the repo)")
    return CORPORA


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
