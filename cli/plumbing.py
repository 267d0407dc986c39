"""CLI plumbing shared by `bert-datagen` and `bert-train`.

LazyGroup: a click group whose subcommands are imported only when used, so `--help` stays fast, a
Dataflow worker that unpickles a DoFn never imports the CLI modules of other commands, and
`bert-train` never loads Beam.

`CleanErrorsGroup` turns every failure into one line on stderr (`Error: <path>: <reason>`), exit 1,
or a usage error, exit 2; SIGINT (and SIGTERM, for a group with ``sigterm_interrupts``) prints
"interrupted" and exits 130 (commands remove their staging and temp files on the way out, in
`finally` blocks). A traceback is shown only with `--debug`
(anywhere on the command line) or `BERT_DATAGEN_DEBUG=1`. Log records that tell a user nothing
(Beam's "apitools not found") and library tracebacks logged before our own error line are hidden
unless debugging. Beam-free: the filters match logger names and messages, they import nothing.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import re
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence

import click

from bert_datagen.contract.bounds import INT64_MAX

DEBUG_FLAG = "--debug"
DEBUG_ENV = "BERT_DATAGEN_DEBUG"
DEBUG_HELP = (f"Show tracebacks and library logs (anywhere on the command line; or {DEBUG_ENV}=1).")
EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
# Messages logged by libraries that carry no information for a user of our commands.
NOISE = ("apitools not found", "bigquery client libraries are not available",
         "Discarding unparseable args", "Make sure that locally built Python SDK docker image")
# Loggers whose records below CRITICAL are hidden by default: their errors reach the user as our
# one-line message; with --debug everything is shown.
QUIET_LOGGERS = ("apache_beam", "distributed", "tornado", "absl")


class _NoiseFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in NOISE)


def quiet_logging(debug: bool) -> None:
    """Keep library logs to what a user needs; call before importing Beam (it logs on import)."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
        root.addHandler(handler)
    if debug:
        return
    for handler in root.handlers:
        if not any(isinstance(f, _NoiseFilter) for f in handler.filters):
            handler.addFilter(_NoiseFilter())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


# A log record as Python's default handler prints it ("WARNING:apache_beam.x:message"), an
# exception in a library's thread (threading.excepthook) or a child process's traceback (this
# process prints none unless --debug), then its continuation lines; ours start with OUR_LINES.
_RECORD = re.compile(rb"^((DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.<>-]*:|Exception in thread |"
                     rb"Traceback \(most recent call last\):)")
OUR_LINES = (b"bert-datagen", b"bert-train", b"Error:", b"warning:", b"interrupted", b"Usage:", b"Try '",
             b"OK:", b"FAILED:", b"problem:")


class ChildLogFilter:
    """Drops log records (with their tracebacks) from a byte stream of stderr lines: worker processes
    a runner starts (Beam's multi-process DirectRunner) log with their own handlers, which the
    filters of this process do not reach; their errors reach the user as our one-line message."""

    def __init__(self, noise: re.Pattern[bytes] | None = None) -> None:
        self.dropping = False
        self.noise = noise  # further lines to drop (a CLI's own: TensorFlow's native start-up lines)

    def keep(self, line: bytes) -> bool:
        if self.noise is not None and self.noise.match(line):
            return False
        if _RECORD.match(line):
            self.dropping = True
        elif not self.dropping or line.startswith(OUR_LINES):
            self.dropping = False
            return True
        return False


_unfiltered_stderr: list[int] = []


def unfiltered_stderr() -> int:
    """The process's stderr before ``filter_process_stderr`` (2 when unfiltered): for a helper
    process whose line must get out while this process cannot run Python (its filter is Python)."""
    return _unfiltered_stderr[-1] if _unfiltered_stderr else 2


def filter_process_stderr(noise: re.Pattern[bytes] | None = None) -> Callable[[], None]:
    """Route file descriptor 2, which child processes inherit, through ``ChildLogFilter``; returns
    the function that restores it (call it before exiting)."""
    original = os.dup(2)
    _unfiltered_stderr.append(original)
    read_end, write_end = os.pipe()
    wake_read, wake_write = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    records = ChildLogFilter(noise)

    def pump() -> None:
        broken = False  # stderr closed (`2>&1 | head`): keep draining, so no writer ever blocks

        def emit(line: bytes) -> None:
            nonlocal broken
            if records.keep(line) and not broken:
                try:
                    os.write(original, line)
                except OSError:
                    broken = True

        poller = select.poll()
        poller.register(read_end, select.POLLIN)
        poller.register(wake_read, select.POLLIN)
        pending, at_end = b"", False
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if read_end in ready:
                chunk = os.read(read_end, 1 << 16)
                at_end = not chunk  # every writer has closed it
                if at_end:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    emit(line + b"\n")
            elif wake_read in ready:  # restore() found nobody left to write, and the pipe is empty
                break
        if pending:
            emit(pending)
        if at_end:  # else a helper still holds the write end: its late lines wait there, unread, as before
            os.close(read_end)

    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(original, 2)  # closes our write end: the pump ends once child processes exit too
        deadline = time.monotonic() + 2.0
        while thread.is_alive() and time.monotonic() < deadline:
            if not _writers_left(os.getpid()):
                os.write(wake_write, b"x")
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
                break
            thread.join(timeout=0.02)
        if not thread.is_alive():
            os.close(wake_read)
            os.close(wake_write)
        _unfiltered_stderr.remove(original)
        os.close(original)

    return restore


# Processes that live as long as ours and hold our stderr: multiprocessing's resource tracker,
# which Dask's local cluster (and PyTorch's DataLoader workers) start with stderr passed on. The
# pipe never reaches end-of-file while they run, so waiting for it cost every Dask run 2 s.
_LIFELONG_HELPERS = (b"from multiprocessing.resource_tracker import main",)


def _writers_left(pid: int) -> bool:
    """Whether a child process of ``pid`` that may still write to its stderr is running; True where
    ``/proc`` cannot tell (then the pump waits for end-of-file, as long as restore() allows)."""
    if not os.path.isdir(f"/proc/{pid}/task"):
        return True
    for child in _descendants(pid):
        try:
            with open(f"/proc/{child}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[-1].split()[0]
            with open(f"/proc/{child}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ")
        except OSError:  # gone meanwhile
            continue
        if state != b"Z" and not any(helper in command for helper in _LIFELONG_HELPERS):
            return True
    return False


def _descendants(pid: int) -> list[int]:
    """Child processes of ``pid``, recursively (Linux /proc; empty elsewhere)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


_SIGINT_SEEN = threading.Event()


def _interrupt_with_children(signum, frame) -> None:
    """SIGINT (or SIGTERM): pass SIGINT on to our child processes, then stop as Python does. Ctrl-C in a terminal
    reaches the whole process group anyway; a `kill -INT` of this process alone would otherwise
    leave a runner waiting forever for worker processes (Beam's multi-process DirectRunner)."""
    _SIGINT_SEEN.set()
    for child in _descendants(os.getpid()):
        try:
            os.kill(child, signal.SIGINT)
        except OSError:
            pass
    raise KeyboardInterrupt


def _terminate_as_interrupt(signum, frame) -> None:
    """SIGTERM gets what SIGINT gets at this moment: the training loop's handler (which finishes the
    step and saves it) or the CLI's (cleanup, exit 130). Where SIGINT is ignored (a background job)
    the CLI's, so that SIGTERM still ends the command."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signal.SIGINT, frame)
    else:
        _interrupt_with_children(signum, frame)


def interrupt_requested() -> bool:
    """True once SIGINT reached this process through the CLI's handler. Long commands check it at
    their first safe point: a KeyboardInterrupt raised inside a third-party import can be swallowed
    there (seen under load while TensorFlow loads), and the command must stop all the same."""
    return _SIGINT_SEEN.is_set()


def debug_requested(args: Sequence[str], environ: dict[str, str] | os._Environ = os.environ) -> bool:
    return DEBUG_FLAG in args or environ.get(DEBUG_ENV, "") not in ("", "0")


def os_error_message(e: OSError) -> str:
    """``<path>: <reason>`` for an OSError, as short as the error allows."""
    reason = e.strerror or str(e) or type(e).__name__
    paths = [p for p in (e.filename, getattr(e, "filename2", None)) if p]
    return f"{' -> '.join(str(p) for p in paths)}: {reason}" if paths else reason


# How Beam re-raises a worker's exception: "OSError: [Errno 28] No space left on device: 'PATH'
# [while running 'Step']", as a RuntimeError (the original chained to it in this process; from a
# worker process, only its text).
_BEAM_STEP = re.compile(r"\[while running '[^']*'\]")
_BEAM_OS_ERROR = re.compile(r"^(?:\w+: )*\w*Error: \[Errno (\d+)\] (.+?)(?:: '([^']+)')?(?:: '([^']+)')? \[while running ")


def wrapped_os_error(exc: BaseException) -> OSError | None:
    """The OSError a runner wrapped into ``exc`` (a disk full in a Beam worker), or None."""
    if not _BEAM_STEP.search(str(exc)):
        return None
    seen: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and not any(cause is s for s in seen):
        if isinstance(cause, OSError):
            return cause
        seen.append(cause)
        cause = cause.__cause__ or cause.__context__
    match = _BEAM_OS_ERROR.match(str(exc))
    if match is None:
        return None
    errno, reason, path, path2 = match.groups()
    return OSError(int(errno), reason, path, None, path2) if path2 else OSError(int(errno), reason, path)


def was_interrupted(exc: BaseException) -> bool:
    """True when ``exc`` is, or wraps, a KeyboardInterrupt (Beam re-raises one in a DoFn as a
    RuntimeError whose message starts with "KeyboardInterrupt")."""
    seen: list[BaseException] = []
    while exc is not None and not any(exc is s for s in seen):
        seen.append(exc)
        if isinstance(exc, KeyboardInterrupt) or str(exc).startswith("KeyboardInterrupt"):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def _exit_interrupted() -> None:
    """"interrupted", exit 130 (``CleanErrorsGroup.main`` ends the process right after its cleanup)."""
    click.echo("interrupted", err=True)
    sys.exit(EXIT_INTERRUPTED)


def _fail(message: str, code: int) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


class CleanErrorsGroup(click.Group):
    """A click group whose ``main`` never lets a traceback through unless asked (see module doc)."""

    stderr_noise: re.Pattern[bytes] | None = None  # lines a subclass's stderr filter also drops
    # SIGTERM (`kill`, a scheduler's stop, a container's shutdown) ends the command as Ctrl-C does:
    # its finally blocks remove its staging files, and it exits 130; the default would end the
    # process at once and leave them for the next run to find.
    sigterm_interrupts: bool = False

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             complete_var: str | None = None, standalone_mode: bool = True, **extra) -> None:
        from_command_line = args is None
        args = list(sys.argv[1:] if args is None else args)
        debug = debug_requested(args)
        args = [a for a in args if a != DEBUG_FLAG]
        quiet_logging(debug)
        restore = filter_process_stderr(self.stderr_noise) if from_command_line and not debug else None
        if from_command_line and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupt_with_children)
        if from_command_line and self.sigterm_interrupts and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminate_as_interrupt)
        interrupted = False
        try:
            self._main_clean(args, prog_name, complete_var, debug, **extra)
        except SystemExit as e:
            interrupted = e.code == EXIT_INTERRUPTED
            if interrupted and from_command_line:
                # A KeyboardInterrupt that landed inside an import can leave a re-armed interrupt
                # behind (seen under load while TensorFlow loads). Only a process about to end may
                # ignore SIGINT: the disposition is inherited by every process it starts.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            raise
        finally:
            if restore is not None:
                restore()
            if interrupted and from_command_line:
                # Commands have removed their staging files by now (their own finally blocks ran).
                # End here: an interrupt that TensorFlow's import machinery re-raises during
                # interpreter shutdown would otherwise end the process by SIGINT instead of 130.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(EXIT_INTERRUPTED)

    def _main_clean(self, args: list[str], prog_name: str | None, complete_var: str | None, debug: bool,
                    **extra) -> None:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except (click.Abort, KeyboardInterrupt):
            _exit_interrupted()
        except click.ClickException as e:
            if debug:
                traceback.print_exc()
            e.show()
            sys.exit(e.exit_code)
        except OSError as e:
            if _SIGINT_SEEN.is_set():
                _exit_interrupted()
            if debug:
                traceback.print_exc()
            _fail(os_error_message(e), EXIT_ERROR)
        except Exception as e:  # noqa: BLE001 - the last line of defence: one line, not a traceback
            # After a SIGINT any failure is its consequence (an import the interrupt cut short
            # fails later with an AttributeError, for one): report the interrupt, not the failure.
            if was_interrupted(e) or _SIGINT_SEEN.is_set():
                _exit_interrupted()
            os_error = wrapped_os_error(e)
            if os_error is not None:
                if debug:
                    traceback.print_exc()
                _fail(os_error_message(os_error), EXIT_ERROR)
            if debug:
                traceback.print_exc()
                _fail(f"{type(e).__name__}: {e}", EXIT_ERROR)
            _fail(f"{type(e).__name__}: {e} (unexpected; rerun with {DEBUG_FLAG} for the traceback)", EXIT_ERROR)
        sys.exit(code if isinstance(code, int) else 0)


class LazyGroup(click.Group):
    def __init__(self, *args, lazy_commands: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy_commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_commands:
            module_name, attr = self.lazy_commands[cmd_name].split(":")
            return getattr(importlib.import_module(module_name), attr)
        return super().get_command(ctx, cmd_name)


class CommandGroup(CleanErrorsGroup, LazyGroup):
    """The top-level group of `bert-datagen` and `bert-train`: lazy subcommands, clean errors."""


class FiniteFloat(click.ParamType):
    """A float option that rejects NaN and infinities (click's FloatRange lets NaN through), with
    optional bounds; the message names the option and the range."""

    name = "float"

    def __init__(self, min: float | None = None, max: float | None = None, *, min_open: bool = False,
                 max_open: bool = False) -> None:
        self.min, self.max, self.min_open, self.max_open = min, max, min_open, max_open

    def _range(self) -> str:
        low = "-inf" if self.min is None else f"{self.min:g}"
        high = "inf" if self.max is None else f"{self.max:g}"
        return f"{'(' if self.min_open or self.min is None else '['}{low}, {high}{')' if self.max_open or self.max is None else ']'}"

    def convert(self, value, param, ctx) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        below = self.min is not None and (number <= self.min if self.min_open else number < self.min)
        above = self.max is not None and (number >= self.max if self.max_open else number > self.max)
        if below or above:
            self.fail(f"{number:g} is not in the range {self._range()}", param, ctx)
        return number


class Int(click.ParamType):
    """An integer option checked to its real range, [min, max] (both inclusive): every integer option
    of both CLIs has this type (tests/contract/test_bounds.py checks), so a value the code
    cannot hold (a count past int64, a seed NumPy refuses) is a usage error naming the option before
    any work, not an OverflowError deep inside."""

    name = "integer"

    def __init__(self, min: int = -INT64_MAX - 1, max: int = INT64_MAX) -> None:
        self.min, self.max = min, max

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not an integer", param, ctx)
        if not self.min <= number <= self.max:
            self.fail(f"{number} is not in the range [{self.min}, {self.max}]", param, ctx)
        return number


def closest_option(name: str, known: Sequence[str]) -> str:
    """`` (did you mean --x?)`` for the known option spelled most like ``name``, or ``""``."""
    import difflib

    normal = {k.replace("_", "-"): k for k in known}
    match = difflib.get_close_matches(name.replace("_", "-"), list(normal), n=1, cutoff=0.6)
    return f" (did you mean {normal[match[0]]}?)" if match else ""


def given(ctx: click.Context, name: str) -> bool:
    """Whether the user gave parameter ``name`` (on the command line or through the environment),
    as opposed to its default."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def refuse_unused_options(ctx: click.Context, unused: dict[str, str]) -> None:
    """Usage error (exit 2) for an option the user gave that this run would ignore; ``unused`` maps
    a parameter name to why it does not apply. A default is never an error: only what the user
    asked for and would not get."""
    for param in ctx.command.params:
        if param.name in unused and given(ctx, param.name):
            raise click.UsageError(f"{param.opts[0]} does not apply here: {unused[param.name]}")


def bucket_deadline_option(command: Callable) -> Callable:
    """Both CLIs' ``--bucket-deadline SECONDS`` (before the command name): set once, for every path
    of the process, on the one client set that reaches buckets (contract/buckets.py)."""
    from bert_datagen.contract.buckets import BUCKETS, MAX_DEADLINE, MIN_DEADLINE, Deadline

    def apply(ctx: click.Context, param: click.Parameter, seconds: float) -> float:
        BUCKETS.deadline = Deadline.within(seconds)
        return seconds

    return click.option(
        "--bucket-deadline", type=FiniteFloat(MIN_DEADLINE, MAX_DEADLINE), default=Deadline().seconds,
        show_default=True, metavar="SECONDS", expose_value=False, callback=apply,
        help=f"A bucket request (s3://, gs://) that gets no answer for this long, its retries included, "
             f"fails naming its path; in [{MIN_DEADLINE:g}, {MAX_DEADLINE:g}] (docs/buckets.md).")(command)
