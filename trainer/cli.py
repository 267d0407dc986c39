"""`bert-train`: pre-train, evaluate and export BERT models."""

from __future__ import annotations

import os
import re
import signal

# TensorFlow's C++ start-up lines (oneDNN notices, CUDA and TPU probing) carry no information for a
# user. The legacy ones obey TF_CPP_MIN_LOG_LEVEL, which must be set before TensorFlow is imported;
# the absl ones ignore it (absl writes everything to fd 2 until InitializeLog, which TensorFlow never
# calls) and are dropped by the group's stderr filter. A user who set TF_CPP_MIN_LOG_LEVEL sees what
# it lets through.
USER_TF_LOG_LEVEL = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import click  # noqa: E402

from contract.cliutil import DEBUG_HELP, CommandGroup  # noqa: E402

COMMANDS = {
    "pretrain": "trainer.train_cli:pretrain_command",
    "eval": "trainer.train_cli:eval_command",
    "export": "trainer.export_cli:export_command",
    "finetune": "trainer.finetune_cli:finetune_command",
    "predict": "trainer.finetune_cli:predict_command",
}

# absl INFO lines ("I0000 00:00:1796114780.736876  1234 port.cc:153] ..."), absl's own notice, and
# the CUDA probing and registration complaints that every CPU-only or pip-installed TensorFlow prints.
TF_NATIVE_NOISE = re.compile(
    rb"^(I\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] "
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|[EW]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] .*(failed call to cuInit|Unable to register cu(DNN|FFT|BLAS) factory"
    rb"|TF-TRT Warning|computation placer already))"
)


class TrainGroup(CommandGroup):
    """`bert-train`'s group: the shared one, whose stderr filter also drops TensorFlow's native noise."""

    stderr_noise = TF_NATIVE_NOISE if USER_TF_LOG_LEVEL is None else None

    def main(self, args=None, *rest, **kwargs):  # type: ignore[override]
        # A scheduler or `kill` stops a run with SIGTERM: it gets what Ctrl-C gets (the training
        # loop saves the step it finished and says where). Not where SIGINT is ignored (a
        # background job), where SIGTERM must keep ending the process.
        if (args is None and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            signal.signal(signal.SIGTERM, _terminate_as_interrupt)
        return super().main(args, *rest, **kwargs)


def _terminate_as_interrupt(signum, frame) -> None:
    os.kill(os.getpid(), signal.SIGINT)


@click.group(cls=TrainGroup, lazy_commands=COMMANDS)
@click.option("--debug", is_flag=True, expose_value=False, help=DEBUG_HELP)
def main() -> None:
    """Pre-train BERT (MLM + NSP) on bert-datagen datasets; fine-tune, evaluate, predict; export."""


if __name__ == "__main__":
    main()
