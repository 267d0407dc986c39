"""The wheels `bench_gpu prepare` carries to the accelerator machines and `measure` unpacks there, and
`bench_gpu`'s refusals before any work."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_gpu, gpu_keras, gpu_wheels


def test_the_wheels_wanted_are_keras_and_what_it_and_the_cli_need_less_what_the_machines_have():
    wanted = gpu_wheels.wanted(set())
    assert {"keras", "namex", "optree", "click", "google-crc32c", "safetensors"} <= wanted
    assert not wanted & {"jax", "jaxlib", "numpy", "h5py", "ml-dtypes", "absl-py", "rich", "torch", "tensorflow"}
    # What a probe found imported is carried too, with what it requires.
    assert "typing-extensions" in gpu_wheels.closure({"optree"})


def test_a_pure_python_wheel_made_from_the_install_here_unpacks_and_imports(tmp_path: Path):
    wheel = gpu_wheels._from_installed("namex", tmp_path)
    assert wheel is not None and wheel.name.startswith("namex-") and wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "namex/__init__.py" in names and any(n.endswith(".dist-info/RECORD") for n in names)
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    wheel.rename(wheels / wheel.name)
    # Installed here, so only unpacked when asked to try every wheel that fits.
    assert gpu_wheels.install(wheels, site) == []
    assert gpu_wheels.install(wheels, site, every_fitting=True) == [f"namex {gpu_wheels.metadata.version('namex')}"]
    where = subprocess.run([sys.executable, "-c", "import namex; print(namex.__file__)"], capture_output=True,
                           text=True, check=True, env=dict(os.environ, PYTHONPATH=str(site))).stdout
    assert Path(where.strip()).is_relative_to(site)


def test_a_compiled_wheel_is_not_made_from_the_install_here(tmp_path: Path):
    assert gpu_wheels._from_installed("optree", tmp_path) is None


def test_which_wheels_fit_this_interpreter():
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert gpu_wheels.fits_here("keras-3.15.1-py3-none-any.whl")
    assert gpu_wheels.fits_here(f"optree-0.20.0-{here}-{here}-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl") == (
        sys.platform == "linux" and os.uname().machine == "x86_64")
    assert not gpu_wheels.fits_here("optree-0.20.0-cp39-cp39-manylinux_2_27_x86_64.whl")
    linux_x86 = sys.platform == "linux" and os.uname().machine == "x86_64"
    assert gpu_wheels.fits_here("safetensors-0.8.0-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl") == linux_x86
    assert not gpu_wheels.fits_here("future-1.0-cp399-abi3-manylinux_2_17_x86_64.whl")
    with pytest.raises(gpu_wheels.WheelError, match="not a wheel"):
        gpu_wheels.fits_here("keras.tar.gz")


def test_a_missing_distribution_whose_wheel_does_not_fit_is_refused_naming_the_fix(tmp_path: Path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "not_here_xyz-1.0-cp39-cp39-manylinux2014_x86_64.whl", "w") as z:
        z.writestr("not_here_xyz/__init__.py", "")
    with pytest.raises(gpu_wheels.WheelError, match=r"not_here_xyz.*--python-version"):
        gpu_wheels.install(wheels, tmp_path / "site")


def test_where_the_package_is_not_installed_a_link_names_the_repository(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(gpu_wheels.importlib.util, "find_spec", lambda name: None)
    (tmp_path / "wheels").mkdir()
    done = gpu_wheels.install(tmp_path / "wheels", tmp_path / "site")
    assert done == [f"bert_datagen -> {gpu_wheels.ROOT}"]
    assert (tmp_path / "site" / "bert_datagen" / "trainer" / "cli.py").is_file()


def test_measure_refuses_a_folder_prepare_did_not_write(tmp_path: Path, capsys):
    assert bench_gpu.main(["measure", "--data", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "--data" in err and "prepare" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, says", [(["--only", "keras-pretrain,nope"], "--only: no section 'nope'"),
                                        (["--device", "tpu"], "--device: cpu or cuda")])
def test_measure_refuses_bad_options(tmp_path: Path, capsys, argv, says):
    with pytest.raises(SystemExit) as stop:
        bench_gpu.main(["measure", "--data", str(tmp_path), "--out", str(tmp_path / "out"), *argv])
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_the_mfu_summary_puts_each_measured_row_beside_its_target():
    rows = [{"section": "keras-pretrain", "size": "base", "stands_for": "base", "seq": 128, "precision": "bf16",
             "mfu": 0.412, "target_mfu": 0.40, "meets_target": True},
            {"section": "keras-pretrain", "size": "large", "seq": 512, "precision": "bf16", "error": "out of memory"},
            {"section": "pretrain", "mfu": 0.2}]
    assert gpu_keras.mfu_summary(rows) == ["base (base) at 128 tokens, bf16: MFU 41.2%, target >= 40%: met"]


def test_the_weights_digest_sees_one_bit(tmp_path: Path):
    a = {"bert/embeddings/word_embeddings": np.arange(6, dtype=np.float32).reshape(2, 3), "cls/b": np.ones(2, np.float32)}
    b = dict(a, **{"cls/b": np.array([1.0, np.nextafter(np.float32(1), np.float32(2))], np.float32)})
    for name, arrays in (("a", a), ("a2", dict(reversed(a.items()))), ("b", b)):
        (tmp_path / name).mkdir()
        np.savez(tmp_path / name / "model.npz", **arrays)
    digest = {name: gpu_keras.weights_digest(tmp_path / name) for name in ("a", "a2", "b")}
    assert digest["a"] == digest["a2"] != digest["b"]


WATCH = """
import sys
from benchmarks.gpu_wheels import ROOT, _ImportWatch
watch = _ImportWatch()
sys.meta_path.insert(0, watch)
exec(compile("import colorsys", str(ROOT / "trainer" / "made_up.py"), "exec"))  # as if one of ours
exec(compile("import wave", str(ROOT / "benchmarks" / "made_up.py"), "exec"))  # not ours
try:
    exec(compile("import tensorflow", str(ROOT / "trainer" / "made_up.py"), "exec"))
except ModuleNotFoundError as exc:
    print("refused:", exc)
print(sorted(watch.ours), watch.tensorflow_from)
"""


def test_the_probe_notes_what_our_modules_import_and_refuses_tensorflow():
    out = subprocess.run([sys.executable, "-c", WATCH], capture_output=True, text=True, check=True,
                         cwd=gpu_wheels.ROOT).stdout.splitlines()
    assert out[0].startswith("refused: No module named 'tensorflow' (blocked")
    assert out[1] == "['colorsys', 'tensorflow'] trainer/made_up.py:1"


def test_prepare_refuses_a_folder_that_cannot_travel(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_wheels, "probe", lambda *a: {"distributions": [], "tensorflow_from": None, "errors": []})
    monkeypatch.setattr(gpu_wheels, "fetch", lambda names, dest, python: [])
    monkeypatch.setattr(gpu_wheels, "_tracked_bytes", lambda: 3 * 2**20)
    with open(tmp_path / "pt-512.bin", "wb") as f:  # sparse: its size counts, no disk is used
        f.truncate(61 * 2**20 + 1)
    with pytest.raises(SystemExit) as stop:
        gpu_wheels.prepare(tmp_path)
    assert "over the 64 MiB a lent machine takes" in str(stop.value) and str(tmp_path) in str(stop.value)
    (tmp_path / "pt-512.bin").unlink()
    gpu_wheels.prepare(tmp_path)  # 3 MiB of tree alone travels
    assert "of the 64 MiB that may travel" in capsys.readouterr().out
