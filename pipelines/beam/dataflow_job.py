"""The job Beam's own DataflowRunner would submit for a pipeline, built offline.

`dataflow_job` runs the pipeline on the DataflowRunner with Beam's ``--dry_run`` test option: the
runner validates the options, applies its overrides, builds the portable (Runner v2) pipeline proto
with its container environment and the artifacts it would stage, and constructs the job, then
returns before it creates an API client. Nothing is uploaded and no address is contacted, so a
machine without the cloud can check what a real submission would carry (tests/pipelines/
test_dataflow_job.py; docs/dataflow.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions


@dataclass(frozen=True)
class StagedFile:
    """An artifact the job stages: its name on the workers, and the local file's size and sha256."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class DataflowJob:
    """What the DataflowRunner would submit (the fields a reviewer of a job checks)."""

    name: str
    job_type: str
    experiments: tuple[str, ...]
    container_images: tuple[str, ...]
    staged: tuple[StagedFile, ...]
    steps: tuple[str, ...]  # the pipeline's top-level transforms, in the order they were applied
    transforms: dict[str, str]  # every transform's full name -> its URN ("" for a composite)
    side_inputs: dict[str, tuple[str, ...]]  # transform -> its side inputs (none expected)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dry_run_options(options: PipelineOptions) -> PipelineOptions:
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    runner = options.view_as(StandardOptions).runner
    if runner != "DataflowRunner":
        raise ValueError(f"a Dataflow job needs --runner DataflowRunner, not {runner!r}")
    # A copy: the caller's options stay as given (the runner adds its experiments to what it runs on).
    return PipelineOptions.from_dictionary({**options.get_all_options(drop_default=True), "dry_run": "True"})


def _staged_file(dependency: Any) -> StagedFile | None:
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2 as api

    if dependency.type_urn != common_urns.artifact_types.FILE.urn:
        return None
    path = Path(api.ArtifactFilePayload.FromString(dependency.type_payload).path)
    name = path.name
    if dependency.role_urn == common_urns.artifact_roles.STAGING_TO.urn:
        name = api.ArtifactStagingToRolePayload.FromString(dependency.role_payload).staged_name
    data = path.read_bytes()  # the runner's own temporary copy, alive until the job is sent
    return StagedFile(name, len(data), hashlib.sha256(data).hexdigest())


def dataflow_job(options: PipelineOptions, build: Callable[[beam.Pipeline], None]) -> DataflowJob:
    """The job the DataflowRunner would submit for the pipeline ``build`` makes, on ``options``
    (``--runner DataflowRunner`` and its options; `runners.runner_setup` adds the wheel), without
    submitting it."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import DebugOptions
    from apache_beam.portability.api import beam_runner_api_pb2 as api

    dry = _dry_run_options(options)
    pipeline = beam.Pipeline(options=dry)
    build(pipeline)
    job = pipeline.run().job
    proto = job.proto_pipeline
    parts = proto.components.transforms
    images, staged = [], []
    for env in proto.components.environments.values():
        images.append(api.DockerPayload.FromString(env.payload).container_image)
        staged += [f for f in map(_staged_file, env.dependencies) if f is not None]
    roots = [t for root in proto.root_transform_ids for t in parts[root].subtransforms]
    pardo = "beam:transform:pardo:v1"
    side_inputs = {t.unique_name: tuple(sorted(api.ParDoPayload.FromString(t.spec.payload).side_inputs))
                   for t in parts.values() if t.spec.urn == pardo}
    return DataflowJob(
        name=job.proto.name,
        job_type=job.proto.type_.name,
        experiments=tuple(sorted(job.options.view_as(DebugOptions).experiments or ())),
        container_images=tuple(sorted(set(images))),
        staged=tuple(sorted(staged, key=lambda f: f.name)),
        steps=tuple(parts[t].unique_name for t in roots),
        transforms=dict(sorted((t.unique_name, "" if t.subtransforms else t.spec.urn)
                               for key, t in parts.items() if key not in proto.root_transform_ids)),
        side_inputs={name: inputs for name, inputs in side_inputs.items() if inputs},
    )
