"""Beam runner setup: DirectRunner (default), DaskRunner, DataflowRunner, PortableRunner.

Runner options never change the bytes of a dataset; they only decide where the work runs.

- DirectRunner: in memory by default; ``--direct_num_workers N`` (N > 1) switches to the
  ``multi_processing`` mode so N worker processes share the work.
- DaskRunner: ``--dask-scheduler ADDRESS`` connects to a running ``dask.distributed`` scheduler;
  without it a local cluster of ``--dask-workers`` processes is started for the run and closed after.
  The runner is ``BalancedDaskRunner`` (``dask_runner.py``): Beam's, with a small Create a partition
  an element and a GroupByKey's groups and ``Spread``'s tasks dealt evenly over partitions.
  ``--dask_npartitions`` defaults to 4 a worker: the least number of partitions a GroupByKey deals
  its groups over (at most 4 times that).
- DataflowRunner: this package must be installed on the workers. Unless the user passes
  ``--setup_file`` or ``--extra_package`` already, a wheel of this package is built into a temporary
  directory and shipped with ``--extra_package``.
- PortableRunner: Beam's portable job API, the way Flink, Spark and Dataflow Runner v2 run Python
  pipelines. Its options (``--job_endpoint``, ``--environment_type``, ``--environment_config``,
  ...) pass through as given; the SDK workers must have this package installed.

Beam itself is imported only when a runner is set up, so the CLI's ``--help`` stays fast.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions

RUNNERS = ("DirectRunner", "DaskRunner", "DataflowRunner", "PortableRunner")
_ALIASES = {name.lower(): name for name in RUNNERS} | {
    "direct": "DirectRunner",
    "dask": "DaskRunner",
    "dataflow": "DataflowRunner",
    "portable": "PortableRunner",
}
# Beam resolves only its built-in runners by short name; on Dask we run our subclass of Beam's runner
# (balanced partitions: pipelines/beam/dask_runner.py), named by its qualified class path.
DASK_RUNNER_PATH = "bert_datagen.pipelines.beam.dask_runner.BalancedDaskRunner"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent
DASK_PARTITIONS_PER_WORKER = 4  # small tasks, so a worker that finishes early takes another


class RunnerError(ValueError):
    """A runner name or runner option that cannot work."""


# Processes a local runner may start: at most this many a core of this machine. More only take
# turns on the same cores (each worker tokenizes on one thread) while each holds its own memory;
# --direct_num_workers=2**63 once started workers until the machine stopped (load average 458).
LOCAL_WORKERS_PER_CORE = 4
# Dataflow's own limit of Compute Engine instances for one job (4,000 where it places the workers).
DATAFLOW_MAX_WORKERS = 4000
# A Dask partition is a task of every stage (a GroupByKey shuffles into as many): 10,000 is 2,500
# workers at the DASK_PARTITIONS_PER_WORKER we set, while a scheduler's graph stays small.
DASK_MAX_PARTITIONS = 10_000
INT32_MAX = 2**31 - 1
MAX_SECONDS = 9_223_372_036  # Python's longest wait (threading.TIMEOUT_MAX)


def local_worker_limit() -> int:
    """The most worker processes a local runner may start on this machine."""
    return LOCAL_WORKERS_PER_CORE * (os.cpu_count() or 1)


def _beam_int_ranges() -> dict[str, tuple[int, int, str]]:
    """The real range of each integer Beam option a user may pass through: (low, high, what it is).
    Any other integer option of Beam's is checked against [0 (or its negative default), int32]: the
    runners hand them on as 32-bit fields (Dataflow's API, the portable job API)."""
    local = local_worker_limit()
    cores = os.cpu_count() or 1
    port = (0, 65535, "a TCP port (0: any free one)")
    return {
        "--direct_num_workers": (0, local, f"worker processes on this machine, at most {LOCAL_WORKERS_PER_CORE} "
                                           f"a core of its {cores} (0: one a core)"),
        "--sdk_worker_parallelism": (0, local, f"SDK worker processes a node, at most {LOCAL_WORKERS_PER_CORE} a core "
                                               f"of this machine's {cores} (0: the runner chooses)"),
        "--num_workers": (1, DATAFLOW_MAX_WORKERS, "Dataflow workers (its limit for one job)"),
        "--max_num_workers": (1, DATAFLOW_MAX_WORKERS, "Dataflow workers (its limit for one job)"),
        "--number_of_worker_harness_threads": (1, 4096, "threads of a worker's SDK harness"),
        "--disk_size_gb": (1, 65536, "a worker's disk in GB (a persistent disk holds at most 64 TB)"),
        "--dask_npartitions": (1, DASK_MAX_PARTITIONS, "Dask partitions (a task of every stage each)"),
        "--dask_partition_size": (1, INT32_MAX, "elements of a Dask partition"),
        "--dask_connection_limit": (1, 65536, "open connections of the Dask client"),
        "--dask_connection_timeout": (1, MAX_SECONDS, "seconds to wait for the Dask scheduler"),
        "--direct_runner_bundle_repeat": (0, 100, "repeats of each bundle (a test of the runner)"),
        "--job_port": port, "--artifact_port": port, "--expansion_port": port, "--hdfs_port": port,
        "--job_server_timeout": (1, MAX_SECONDS, "seconds"),
        "--wait_until_finish_duration": (1, MAX_SECONDS * 1000, "milliseconds"),
        "--element_processing_timeout_minutes": (1, MAX_SECONDS // 60, "minutes"),
        "--parallelism": (-1, 32768, "Flink parallelism (-1: the runner's default; Flink's maximum is 32,768)"),
        "--max_parallelism": (-1, 32768, "Flink parallelism (-1: the runner's default; Flink's maximum is 32,768)"),
    }


def check_beam_ranges(beam_args: list[str]) -> None:
    """RunnerError, naming the option, its value and its range, for a numeric Beam option given
    outside its real range (`_beam_int_ranges`); checked before any work, and never starts Beam
    when no Beam option is given."""
    given = [a.split("=", 1)[0] for a in beam_args if a.startswith("--")]
    if not given:
        return
    from bert_datagen.pipelines.beam.parser import BeamOptionError, beam_parser

    parser = beam_parser()
    try:
        namespace, _ = parser.parse_known_args(list(beam_args))
    except BeamOptionError as e:
        raise RunnerError(f"Beam option: {e}") from e
    ranges = _beam_int_ranges()
    for name in dict.fromkeys(given):
        action = parser._option_string_actions.get(name)
        if action is None or action.nargs == 0:
            continue
        value = getattr(namespace, action.dest, None)
        known = ranges.get(name)
        kind = getattr(action.type, "__name__", "")
        if known is None and kind == "float":
            if not math.isfinite(value) or value < 0:
                raise RunnerError(f"{name} {value} must be a finite number >= 0")
            continue
        if known is None and kind != "int":
            continue  # text, lists and flags: Beam's own parser has checked them
        low, high, what = known or (min(0, action.default or 0), INT32_MAX, "a 32-bit count")
        try:
            number = int(str(value).strip())
        except ValueError:
            raise RunnerError(f"{name} {_flag_value(beam_args, name)!r} is not an integer ({what})") from None
        if not low <= number <= high:
            raise RunnerError(f"{name} {number} is not in [{low}, {high}]: {what}")


@dataclass
class RunnerSetup:
    """What the driver needs to run a pipeline on one runner."""

    runner: str
    options: PipelineOptions
    args: list[str] = field(default_factory=list)  # the final Beam argv, for the manifest/logs
    local: bool = True  # work runs on this machine (progress lines reach this terminal)
    workers: int = 1


@dataclass(frozen=True)
class RunnerOptions:
    """Where a pipeline runs (the runner options of `run` and `task`): never a byte of the dataset."""

    runner: str = "DirectRunner"  # one of RUNNERS; given as any alias or case (canonical_runner)
    beam_args: tuple[str, ...] = ()  # Beam PipelineOptions, passed through as given
    dask_scheduler: str | None = None  # DaskRunner: a running scheduler's address; None: a local cluster
    dask_workers: int = 2  # DaskRunner without dask_scheduler: worker processes of the local cluster

    def __post_init__(self) -> None:
        object.__setattr__(self, "runner", canonical_runner(self.runner))
        object.__setattr__(self, "beam_args", tuple(self.beam_args))
        self.validate()

    def validate(self) -> None:
        if _has_flag(list(self.beam_args), "--runner"):
            raise RunnerError("pass the runner with --runner NAME of bert-datagen, not as a Beam option")
        if _has_flag(list(self.beam_args), "--dry_run"):
            # A run is two jobs, the second built from the census the first one writes: Beam's dry
            # run of the first leaves nothing to build the second from (the run then failed on a
            # missing read-summary.json).
            raise RunnerError("--dry_run: a run is two Beam jobs, the second built from what the first one "
                              "writes, so it cannot be dry-run from the command line; build both Dataflow jobs "
                              "without submitting them with bert_datagen.pipelines.beam.dataflow_job "
                              "(docs/dataflow.md)")
        if not 1 <= self.dask_workers <= local_worker_limit():
            raise RunnerError(f"--dask-workers {self.dask_workers} must be in [1, {local_worker_limit()}]: worker "
                              f"processes of a local Dask cluster, at most {LOCAL_WORKERS_PER_CORE} a core of this "
                              f"machine's {os.cpu_count() or 1}")
        check_beam_ranges(list(self.beam_args))
        if self.runner == "DaskRunner":
            check_dask_installed()


def canonical_runner(name: str) -> str:
    runner = _ALIASES.get(name.strip().lower())
    if runner is None:
        raise RunnerError(f"--runner {name!r} is not one of {', '.join(RUNNERS)}")
    return runner


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value of ``--flag=value`` or ``--flag value`` in a Beam argv (last one wins)."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _has_flag(args: list[str], *flags: str) -> bool:
    return any(arg == f or arg.startswith(f + "=") for arg in args for f in flags)


def direct_args(beam_args: list[str]) -> tuple[list[str], int]:
    args = list(beam_args)
    workers_text = _flag_value(args, "--direct_num_workers")
    workers = int(workers_text) if workers_text else 1
    if workers < 0:
        raise RunnerError(f"--direct_num_workers {workers} must be >= 0 (0: one per CPU)")
    if workers == 0:
        workers = os.cpu_count() or 1
        args = [a for a in args if not a.startswith("--direct_num_workers")] + [
            f"--direct_num_workers={workers}"
        ]
    if workers > 1 and not _has_flag(args, "--direct_running_mode"):
        args.append("--direct_running_mode=multi_processing")
    if not _has_flag(args, "--allow_unsafe_triggers"):
        # Beam's DirectRunner otherwise first tries Prism, a Go runner it downloads at run time:
        # offline that costs a failed download on every run, online it runs the job on another
        # engine that ignores --direct_num_workers. This flag (which only relaxes checks on
        # triggers, and this pipeline sets none) is the one switch that keeps the DirectRunner on
        # its own FnApiRunner, the engine every reproducibility test here runs on.
        args.append("--allow_unsafe_triggers")
    if not _has_flag(args, "--default_sdk_harness_log_level"):
        # Worker processes otherwise log every bundle at INFO onto the user's terminal.
        args.append("--default_sdk_harness_log_level=WARNING")
    return args, workers


DIRECT = RunnerOptions()  # the default: Beam's DirectRunner in this process


def stop_workers_that_connect_late() -> None:
    """Make Beam's FnApiRunner tell a worker process that connects after the run has ended to stop.

    With worker processes, a bundle that fails early (a binary input file) ends the run while a
    slower worker is still starting. Beam closes that worker's control connection only if the
    worker has connected; otherwise it marks the connection done and sends nothing, the worker then
    connects, waits for instructions forever, and the runner waits forever for it to exit (seen on
    a loaded machine, about 1 run in 30). Queuing the end-of-stream marker in that case too lets
    the late worker find it at once and exit. Idempotent; touches nothing else.
    """
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    connection = worker_handlers.ControlConnection
    servicer = worker_handlers.BeamFnControlServicer
    if getattr(connection.close, "stops_late_workers", False):
        return
    if not (hasattr(connection, "_lock") and hasattr(servicer, "UNSTARTED_STATE") and hasattr(servicer, "_DONE_MARKER")):
        return  # a Beam whose control connection is built otherwise: leave it as it is
    original_close = connection.close

    def close(self) -> None:
        with connection._lock:
            if getattr(self, "_state", None) == servicer.UNSTARTED_STATE:
                self._push_queue.put(servicer._DONE_MARKER)
        original_close(self)

    close.stops_late_workers = True  # type: ignore[attr-defined]
    connection.close = close


def build_wheel(out_dir: str) -> str:
    """A wheel of this package (pure Python) for Dataflow's ``--extra_package``."""
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
           "-w", out_dir, str(PACKAGE_ROOT)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RunnerError(f"building a wheel of bert-datagen for Dataflow failed:\n{done.stderr[-2000:]}")
    wheels = sorted(Path(out_dir).glob("bert_datagen-*.whl"))
    if not wheels:
        raise RunnerError(f"pip wheel produced no bert_datagen wheel in {out_dir}")
    return str(wheels[-1])


def dataflow_args(beam_args: list[str], wheel_dir: str, wheel_builder=build_wheel) -> list[str]:
    args = list(beam_args)
    missing = [f for f in ("--project", "--region", "--temp_location") if not _has_flag(args, f)]
    if missing:
        raise RunnerError(f"--runner DataflowRunner needs {', '.join(missing)} (Beam pipeline options)")
    if not _has_flag(args, "--setup_file", "--extra_package", "--extra_packages", "--sdk_container_image"):
        args.append(f"--extra_package={wheel_builder(wheel_dir)}")
    return args


def portable_args(beam_args: list[str]) -> list[str]:
    if not _has_flag(beam_args, "--job_endpoint"):
        raise RunnerError("--runner PortableRunner needs --job_endpoint (a job service address, or embed)")
    return list(beam_args)


def check_dask_installed() -> None:
    """RunnerError unless dask and distributed are installed: found before any work, not when the
    cluster starts (imported then; finding them is enough here and keeps this check cheap)."""
    from importlib.util import find_spec

    missing = [name for name in ("dask", "distributed") if find_spec(name) is None]
    if missing:
        raise RunnerError(f"--runner DaskRunner needs {' and '.join(missing)}: pip install 'bert-datagen[dask]'")


@contextlib.contextmanager
def local_dask_cluster(workers: int) -> Iterator[str]:
    """A local dask.distributed cluster of worker processes; yields the scheduler address."""
    try:
        from distributed import LocalCluster
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RunnerError("--runner DaskRunner needs dask[distributed]: pip install 'bert-datagen[dask]'") from e
    import logging

    for name in ("distributed", "distributed.scheduler", "distributed.nanny", "distributed.core"):
        logging.getLogger(name).setLevel(logging.WARNING)
    import dask

    # Dask's nannies give each worker MALLOC_TRIM_THRESHOLD_=65536, and any explicit trim threshold
    # turns off glibc's sliding mmap threshold: every large array the pipeline frees and allocates
    # again per block becomes a fresh mmap and its page faults (4x enwiki, one worker: 12.3 s of
    # system time against 4.3 s without it, 43 against 31 CPU s in all).
    environ = {k: v for k, v in dask.config.get("distributed.nanny.pre-spawn-environ", {}).items()
               if k != "MALLOC_TRIM_THRESHOLD_"}
    # Each worker also samples its own stack every 10 ms for the dashboard's profile, and this cluster
    # has no dashboard (100x enwiki on two workers, one pair of runs: 433 CPU s with it, 405 without;
    # at 10x the difference is within run-to-run noise).
    # A worker is handed its next task when it finishes one (Dask's default 1.1 queues a second on a
    # one-thread worker, which may then wait while the other worker idles at the end of a stage).
    settings = {"distributed.nanny.pre-spawn-environ": environ, "distributed.worker.profile.enabled": False,
                "distributed.scheduler.worker-saturation": 1.0}
    with dask.config.set(settings):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=40)
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


@contextlib.contextmanager
def runner_setup(options: RunnerOptions) -> Iterator[RunnerSetup]:
    """PipelineOptions for ``options.runner`` (plus a local Dask cluster when needed), cleaned up on exit."""
    runner = canonical_runner(options.runner)
    args = list(options.beam_args)
    dask_scheduler, dask_workers = options.dask_scheduler, options.dask_workers
    with contextlib.ExitStack() as stack:
        if runner == "DirectRunner":
            args, workers = direct_args(args)
            if workers > 1:
                stop_workers_that_connect_late()
            local = True
        elif runner == "DaskRunner":
            address = dask_scheduler or _flag_value(args, "--dask_client_address")
            if address is None:
                address = stack.enter_context(local_dask_cluster(dask_workers))
            if not _has_flag(args, "--dask_client_address"):
                args.append(f"--dask_client_address={address}")
            workers = dask_workers
            if not _has_flag(args, "--dask_npartitions", "--dask_partition_size"):
                args.append(f"--dask_npartitions={DASK_PARTITIONS_PER_WORKER * workers}")
            local = dask_scheduler is None
        elif runner == "DataflowRunner":
            wheel_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bert-datagen-wheel-"))
            args = dataflow_args(args, wheel_dir)
            workers = 0
            local = False
        else:  # PortableRunner: the job service and the SDK workers are the user's (docs/pipeline.md)
            args = portable_args(args)
            workers = 0
            local = False
        from apache_beam.options.pipeline_options import PipelineOptions

        runner_arg = DASK_RUNNER_PATH if runner == "DaskRunner" else runner
        options = PipelineOptions([f"--runner={runner_arg}", *args])
        yield RunnerSetup(runner=runner, options=options, args=args, local=local, workers=workers)
