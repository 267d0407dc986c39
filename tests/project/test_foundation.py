"""The skeleton: importing the data side never imports TensorFlow; the CLIs list their commands."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize(
    "module",
    ["datagen", "pipelines", "vocab", "bert_datagen.datagen.records", "bert_datagen.datagen.rng", "bert_datagen.pipelines.cli"],
)
def test_data_side_does_not_import_tensorflow(module: str) -> None:
    loaded = _run_python(
        f"import sys, importlib; importlib.import_module({module!r}); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))"
    )
    assert loaded == "[]", f"{module} pulled in {loaded}"


def test_bert_datagen_help_lists_subcommands() -> None:
    from click.testing import CliRunner

    from bert_datagen.pipelines.cli import COMMANDS, main

    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    for name in COMMANDS:
        assert name in result.output


def test_bert_train_help_lists_subcommands() -> None:
    from click.testing import CliRunner

    from bert_datagen.trainer.cli import COMMANDS, main

    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    for name in COMMANDS:
        assert name in result.output


def test_pyproject_installs_without_setuptools_warnings() -> None:
    # A `project.license` table draws a SetuptoolsDeprecationWarning on every install; an SPDX
    # string needs setuptools >= 77, which build-system.requires must then ask for.
    import tomllib
    import warnings
    from pathlib import Path

    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    pyproject = Path(__file__).resolve().parent.parent.parent / "pyproject.toml"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), str(pyproject))
    assert dist.metadata.license_expression == "Apache-2.0"
    requires = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
    assert "setuptools>=77" in requires and int(setuptools.__version__.split(".")[0]) >= 77
