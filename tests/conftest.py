"""Shared test helpers: the reference-data folder and a CLI runner."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvbound.cli import main

REPO = Path(__file__).resolve().parents[1]
#: real traces and profiles, outside the repository (see ../shared/data/README.md); never copied in
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

#: Figure 15 of the seed paper at I = 2, O = 2 (M = max(2I, I + O - 1) = 4, A100 preset): evicting pays,
#: and the optimum is tiny to prove
FIG15_TINY = """
name = "fig15-tiny"
[system]
kv_capacity = 4
max_batch_tokens = 64
[cost]
preset = "llama2-7b-a100"
[[requests]]
prompt = 2
output = 2
count = 2
"""


@pytest.fixture
def shared_data() -> Path:
    """The reference-data folder; skips the test (saying why) when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"reference data folder {SHARED_DATA} is absent: the trace and profile tests need "
                    "../shared/data/ beside the repository (see its README.md)")
    return SHARED_DATA


@pytest.fixture
def cli(capsys):
    """Run `kvbound.cli.main(argv)`; returns (exit status, stdout, stderr)."""

    def run(*argv) -> tuple[int, str, str]:
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's own errors exit instead of returning
            rc = exc.code
        captured = capsys.readouterr()
        return rc, captured.out, captured.err

    return run


@pytest.fixture
def write_file(tmp_path):
    """Write text (or bytes) to tmp_path/name and return the path."""

    def write(name: str, content: str | bytes) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    return write


@pytest.fixture
def tiny_auto_limits(monkeypatch):
    """`--formulation auto` finds no model small enough (every model's auto limit 10 variables): the search runs."""
    from dataclasses import replace

    from kvbound.formulation import FORMULATION_KINDS

    for name, kind in list(FORMULATION_KINDS.items()):
        if kind.auto_limit:
            monkeypatch.setitem(FORMULATION_KINDS, name, replace(kind, auto_limit=10))
