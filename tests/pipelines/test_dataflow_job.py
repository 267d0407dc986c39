"""Issue #44 point 4 (a): the job Beam's own DataflowRunner would submit for `bert-datagen run`'s two
pipelines, built offline (`bert_datagen.pipelines.beam.dataflow_job`, Beam's ``--dry_run``) in a
process that may reach no address but 127.0.0.1 (the bucket tests' socket guard): Runner v2, this
checkout's wheel staged and nothing of ours besides it, no side input, every transform one we
apply on primitives Runner v2 runs itself."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import apache_beam
import pytest

from tests.support.pipeline_corpus import write_vocab
from tests.support.servers import guard_sitecustomize

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
WHEEL = f"bert_datagen-{VERSION}-py3-none-any.whl"

READ_STEPS = ["ListFiles", "ReadFiles", "ReadKey", "GroupReads", "ReadCensus"]
BUILD_STEPS = ["ListSpills", "AssignPools", "GroupPools", "StagePools", "PoolStats", "FanOutPasses", "SpreadTasks",
               "BuildInstances", "EmptyShards", "AllShardParts", "GroupShards", "WriteShards", "AllResults",
               "ResultsKey", "GroupResults", "Summarize"]

# Run in a child process under the guard: builds both jobs as the driver would for a bucket
# dataset, and reports them with the wheel runner_setup built (its files and their sha256).
SCRIPT = r'''
import hashlib, json, sys, zipfile
from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.vocab_io import load_vocab
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.pipelines.beam.dataflow_job import dataflow_job
from bert_datagen.pipelines.beam.runners import RunnerOptions, runner_setup
from bert_datagen.pipelines.pretraining.run import (PipelinePlan, ReadSummary, build_pipeline,
                                                    build_read_pipeline)

vocab_path, bucket = sys.argv[1], "gs://corpus-bucket"
staging = f"{bucket}/out/.bert-datagen-staging-{'0' * 32}"
config = DatagenConfig(max_seq_length=32, max_predictions_per_seq=5, num_shards=2, input_format="sentences")
plan = PipelinePlan(config=config, vocab=load_vocab(vocab_path, LOCAL_FS),
                    files=[(f"{bucket}/in/a.txt", 1000, 0, None), (f"{bucket}/in/b.txt", 1000, 0, None)],
                    output_dir=staging, summary_path=f"{staging}/work/summary.json", staging_dir=f"{staging}/work")
read = ReadSummary(spills=[("train", f"{staging}/work/read/a-train.bin"), ("eval", f"{staging}/work/read/a-eval.bin")],
                   num_pools={"train": 2, "eval": 1}, num_shards={"train": 2, "eval": 1}, totals={},
                   fingerprint="0" * 64)
runner = RunnerOptions(runner="dataflow", beam_args=("--project=bert-datagen-test", "--region=europe-west4",
                                                     f"--temp_location={bucket}/tmp"))
with runner_setup(runner) as setup:
    wheel = next(a.split("=", 1)[1] for a in setup.args if a.startswith("--extra_package="))
    with zipfile.ZipFile(wheel) as z:
        files = {n: hashlib.sha256(z.read(n)).hexdigest() for n in z.namelist()}
    jobs = [dataflow_job(setup.options, lambda p: build_read_pipeline(p, plan)).to_dict(),
            dataflow_job(setup.options, lambda p: build_pipeline(p, plan, read)).to_dict()]
    report = {"jobs": jobs, "wheel": {"sha256": hashlib.sha256(open(wheel, "rb").read()).hexdigest(),
                                      "files": files},
              "runner_options_after": setup.options.get_all_options(drop_default=True)}
print(json.dumps(report))
'''


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    from importlib.util import find_spec

    # Beam's DataflowRunner builds its job with the Dataflow API's types (part of apache-beam[gcp]).
    assert find_spec("google.cloud.dataflow") is not None, "pip install 'google-cloud-dataflow-client>=0.13,<0.14'"
    tmp = tmp_path_factory.mktemp("dataflow_job")
    log = tmp / "guard.log"
    env = {**os.environ, **guard_sitecustomize(tmp, log), "AWS_EC2_METADATA_DISABLED": "true", "NO_GCE_CHECK": "True"}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    (tmp / "build_jobs.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(tmp / "build_jobs.py"), str(write_vocab(tmp / "vocab.txt"))],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["refused"] = log.read_text()
    return result


def test_building_the_jobs_contacts_nothing(report) -> None:
    assert report["refused"] == ""


def test_both_jobs_are_runner_v2_batch_jobs_on_this_beams_container(report) -> None:
    image = (f"gcr.io/cloud-dataflow/v1beta3/beam_python{sys.version_info.major}.{sys.version_info.minor}_sdk:"
             f"{apache_beam.__version__}")
    for job in report["jobs"]:
        assert job["job_type"] == "JOB_TYPE_BATCH"
        assert {"use_runner_v2", "use_portable_job_submission", "beam_fn_api"} <= set(job["experiments"])
        assert job["container_images"] == [image]
    # The caller's options are left as given: the dry run worked on a copy.
    assert "dry_run" not in report["runner_options_after"]


def test_the_staged_wheel_is_this_checkouts_and_the_only_package_of_ours(report) -> None:
    for job in report["jobs"]:
        staged = {f["name"]: f for f in job["staged"]}
        packages = [n for n in staged if n.endswith((".whl", ".tar.gz", ".zip"))]
        assert packages == [WHEEL]
        assert staged[WHEEL]["sha256"] == report["wheel"]["sha256"]
        # Beyond the wheel only Beam's own bookkeeping: the list of extra packages, the main session,
        # the submitting environment's package versions.
        assert sorted(staged) == sorted([WHEEL, "extra_packages.txt", "pickled_main_session",
                                         "submission_environment_dependencies.txt"])
    files = report["wheel"]["files"]
    # Every module of every package pyproject lists is in it, byte for byte this checkout's.
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    expected = {}
    for package in packages:
        folder = REPO.joinpath(*package.split(".")[1:])
        for path in folder.glob("*.py"):
            expected[f"{package.replace('.', '/')}/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(expected) > 100
    assert {name: files.get(name) for name in expected} == expected
    assert f"bert_datagen-{VERSION}.dist-info/METADATA" in files


def test_no_side_inputs_and_every_transform_known(report) -> None:
    read_job, build_job = report["jobs"]
    assert read_job["steps"] == READ_STEPS
    assert build_job["steps"] == BUILD_STEPS
    primitives = {"beam:transform:impulse:v1", "beam:transform:pardo:v1", "beam:transform:group_by_key:v1",
                  "beam:transform:flatten:v1"}
    for job, steps in ((read_job, READ_STEPS), (build_job, BUILD_STEPS)):
        assert job["side_inputs"] == {}
        names = job["transforms"]
        # Each transform is one of our steps or a part of one (Create's and Reshuffle's own).
        assert {name.split("/", 1)[0] for name in names} == set(steps)
        assert {urn for urn in names.values() if urn} <= primitives


def test_a_dataflow_job_needs_the_dataflow_runner() -> None:
    from apache_beam.options.pipeline_options import PipelineOptions

    from bert_datagen.pipelines.beam.dataflow_job import dataflow_job

    with pytest.raises(ValueError, match="DataflowRunner"):
        dataflow_job(PipelineOptions(["--runner=DirectRunner"]), lambda p: None)


def test_run_refuses_beams_dry_run_before_any_work(tmp_path) -> None:
    (tmp_path / "in.txt").write_text("One sentence.\nAnother one.\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "bert_datagen.pipelines.cli", "run", "--input", str(tmp_path / "in.txt"),
         "--vocab", str(write_vocab(tmp_path / "vocab.txt")), "--output", str(out), "--runner", "DataflowRunner",
         "--project", "bert-datagen-test", "--region", "europe-west4", "--temp_location", "gs://corpus-bucket/tmp",
         "--dry_run=True"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "--dry_run" in error[0] and "dataflow_job" in error[0], done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
