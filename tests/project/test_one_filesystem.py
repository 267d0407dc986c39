"""One filesystem interface (bert_datagen.contract.fs): no module outside it tests a path for "://"
itself or builds its own temp name, so every temp file has the one form every cleanup knows."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("vocab", "datagen", "contract", "cli", "pipelines", "trainer", "examples", "benchmarks", "tests/support")
SEAM = "contract/fs.py"
# Files that may build their own temp names, and why.
OWN_TEMP_NAMES = {
    # Below contract/ in the layering, so it cannot import the interface.
    "datagen/embedded.py",
    # Checkpoint temp directories (`.tmp-ckpt-<step>-*`, mkdtemp) have their own cleanup
    # (checkpoint.cleanup_partial), which tests and older runs rely on.
    "trainer/runtime/checkpoint.py",
}
SCHEME_TEST = re.compile(r"""["']://["']\s+(not\s+)?in\b|\bin\s+["']://["']""")
TEMP_LITERAL = re.compile(r"""["'][^"'\n]*\.tmp\b[^"'\n]*["']""")


def _sources() -> list[tuple[str, str]]:
    files = sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py"))
    return [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")) for p in files]


def test_no_module_outside_the_seam_tests_for_a_scheme() -> None:
    found = [f"{rel}:{n}" for rel, text in _sources() if rel != SEAM
             for n, line in enumerate(text.splitlines(), 1) if SCHEME_TEST.search(line)]
    assert not found, f"test paths with bert_datagen.contract.fs.is_remote: {found}"


def test_no_module_outside_the_seam_builds_a_temp_name() -> None:
    found = [f"{rel}:{n}: {line.strip()}" for rel, text in _sources() if rel != SEAM and rel not in OWN_TEMP_NAMES
             for n, line in enumerate(text.splitlines(), 1) if TEMP_LITERAL.search(line)]
    assert not found, f"write through bert_datagen.contract.fs (write_atomic, replacing, temp_name): {found}"


def test_the_checks_would_catch_what_they_forbid() -> None:
    assert SCHEME_TEST.search('if "://" in path:') and SCHEME_TEST.search("if '://' not in p:")
    assert TEMP_LITERAL.search('tmp = path + ".tmp"') and TEMP_LITERAL.search('f"{path}.tmp-{os.getpid()}"')
    assert not SCHEME_TEST.search('PREFIX = f"{SCHEME}://"') and not TEMP_LITERAL.search("tmp_path / 'x'")


def test_every_cleanup_knows_the_one_temp_form(tmp_path) -> None:
    from bert_datagen.contract.fs import temp_name
    from bert_datagen.pipelines.beam.outputs import OUR_TEMP_NAMES

    name = temp_name("part-00000-of-00001.tfrecord")
    assert OUR_TEMP_NAMES.match(name)  # pipelines' staging recovery
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    for directory in (run, run / "eval"):
        (directory / temp_name("metrics.json")).write_text("partial")
    from bert_datagen.trainer.runtime.rundir import cleanup_temp  # the trainer's run directories

    cleanup_temp(run)
    assert sorted(p.name for p in run.rglob("*")) == ["eval"]
