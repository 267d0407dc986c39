"""Fine-tuning on both Keras backends (issue #42): the same loop, heads and numbers on TensorFlow and
JAX, with dropout on (the tiny model's 0.1 and each head's own): 50 steps of classification, span and
tagging end alike; a JAX run resumed is bitwise the straight one; a run moves from TensorFlow to JAX;
two devices of one process with accumulation equal one; predictions of one checkpoint agree.

Each backend runs in a process of its own (`tests/support/backend_runs.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("tensorflow")

from tests.support.task_fixtures import (  # noqa: E402
    classification_dataset,
    span_dataset,
    tagging_dataset,
    write_pretrain_run,
)
from tests.trainer.test_backends import NO_EFFECT, on_backend, weights, worst_difference  # noqa: E402

HEADS = ("classification", "span", "tagging")
STEPS = 50
# Weights whose true gradient is 0 (NO_EFFECT says why for the attention key bias): a span's start
# and end logits go through a softmax over positions, so adding one constant to every position's
# logit changes nothing; the span head's bias adds such a constant, and so does the last layer's
# output LayerNorm beta, which reaches nothing but that head (span heads do not read the pooler).
# Each backend's rounding noise moves them by amounts of that noise's size (about 1e-6 here).
SPAN_NO_EFFECT = ("cls/squad/output_bias", "/output/LayerNorm/beta")


def compared(a: dict, b: dict, head: str) -> tuple[float, float]:
    """(the worst relative difference over the weights that have an effect, the worst absolute
    difference over those that have none)."""
    none = [k for k in a if NO_EFFECT in k or (head == "span" and (k == SPAN_NO_EFFECT[0] or (
        k.startswith(f"bert/encoder/layer_{last_layer(a)}/") and k.endswith(SPAN_NO_EFFECT[1]))))]
    kept = {k: v for k, v in a.items() if k not in none}
    rel = worst_difference(kept, {k: b[k] for k in kept}, skip=None)
    return rel, max(float(np.max(np.abs(a[k] - b[k]))) for k in none)


def last_layer(arrays: dict) -> int:
    return max(int(k.split("/")[2].split("_")[1]) for k in arrays if k.startswith("bert/encoder/layer_"))


def finetune_spec(data: str, out: Path, init: str, backend: str, **kw) -> dict:
    return {"data": data, "out": str(out), "init_from": init, "epochs": 100, "max_steps": STEPS,
            "learning_rate": 1e-3, "batch_size": 8, "seed": 5, "log_every": 10, "checkpoint_every": 10,
            "keep_checkpoints": 10, "eval_batch_size": 16, "backend": backend, **kw}


def last_weights(run: Path) -> dict[str, np.ndarray]:
    step = max(int(p.name.split("-")[1]) for p in run.glob("ckpt-*"))
    return weights(run, step)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("ft")
    init = write_pretrain_run(str(tmp / "init"))
    data = {"classification": classification_dataset(str(tmp / "cls")),
            "span": span_dataset(str(tmp / "span")), "tagging": tagging_dataset(str(tmp / "tag"))}
    r = {"data": data, "tmp": tmp}
    specs: dict[str, list] = {"tensorflow": [], "jax": []}
    for backend in specs:
        for head in HEADS:
            r[backend, head] = tmp / f"{backend}-{head}"
            specs[backend].append(finetune_spec(data[head], r[backend, head], init, backend))
    cls = data["classification"]
    r["tf_half"], r["jax_resumed"], r["tf_then_jax"] = tmp / "tf_half", tmp / "jax_resumed", tmp / "tf_then_jax"
    specs["tensorflow"].append(finetune_spec(cls, r["tf_half"], init, "tensorflow", stop_at=20))
    specs["jax"] += [finetune_spec(cls, r["jax_resumed"], init, "jax", stop_at=20),
                     finetune_spec(cls, r["jax_resumed"], init, "jax"),
                     finetune_spec(cls, r["tf_then_jax"], init, "jax", copy_from=str(r["tf_half"]))]
    predicted = {b: tmp / f"predicted-{b}.npz" for b in specs}
    r["logs"] = {}
    r["logs"]["tensorflow"] = on_backend("tensorflow", {"finetune_runs": specs["tensorflow"]}, tmp)
    # Both backends predict from the one checkpoint TensorFlow trained.
    for backend in specs:
        predict = [{"run": str(r["tensorflow", "span"]), "data": data["span"], "split": "dev",
                    "out": str(predicted[backend])}]
        if backend == "jax":
            r["logs"]["jax"] = on_backend("jax", {"finetune_runs": specs["jax"], "predictions": predict}, tmp)
        else:
            on_backend("tensorflow", {"predictions": predict}, tmp)
    r["predicted"] = predicted
    return r


def first_line(log: str) -> str:
    """The run's first line (after the notes the checks print)."""
    return next(line for line in log.splitlines() if not line.startswith("note:"))


def final_metrics(run: Path) -> dict:
    return json.loads((run / "final_metrics.json").read_text())


@pytest.mark.parametrize("head", HEADS)
def test_fifty_steps_of_each_head_end_alike_on_both_backends(runs, head):
    tf_run, jax_run = runs["tensorflow", head], runs["jax", head]
    a, b = final_metrics(tf_run), final_metrics(jax_run)
    assert a["history"][-1]["step"] == b["history"][-1]["step"] == STEPS
    points = 1.0 if head == "span" else 0.01  # SQuAD's scores are percentages, the others fractions
    for name, value in a["final"].items():  # eval metrics within 0.5 points
        assert abs(value - b["final"][name]) <= 0.5 * points, (name, value, b["final"][name])
    worst, no_effect = compared(last_weights(tf_run), last_weights(jax_run), head)
    print(f"{head}: weights within {worst:.2e} (relative); those without effect within {no_effect:.1e}")
    assert worst <= 1e-3 and no_effect <= 1e-4


def test_the_logged_losses_agree_within_1e_3(runs):
    def losses(log: str) -> list[float]:
        return [float(line.split("loss ")[1].split()[0]) for line in log.splitlines() if line.startswith("step ")]

    tf_losses, jax_losses = losses(runs["logs"]["tensorflow"]), losses(runs["logs"]["jax"])
    # TensorFlow's log: the three heads, then the half run; JAX's: the three heads first.
    per_run = STEPS // 10
    for i, head in enumerate(HEADS):
        a = tf_losses[i * per_run:(i + 1) * per_run]
        b = jax_losses[i * per_run:(i + 1) * per_run]
        assert len(a) == len(b) == per_run
        np.testing.assert_allclose(b, a, atol=1e-3, err_msg=head)


def test_the_first_line_names_the_backend(runs):
    for backend in ("tensorflow", "jax"):
        first = first_line(runs["logs"][backend])
        assert first.endswith(f"Keras on {backend}"), first
    state = json.loads((runs["jax", "span"] / "ckpt-00000050" / "state.json").read_text())
    assert state["backend"] == "jax"


def test_a_jax_fine_tuning_run_resumed_ends_bitwise_as_the_straight_run(runs):
    straight, resumed = last_weights(runs["jax", "classification"]), last_weights(runs["jax_resumed"])
    assert all(np.array_equal(straight[k], resumed[k]) for k in straight)
    for name in ("optimizer.npz",):
        with np.load(runs["jax", "classification"] / "ckpt-00000050" / name) as x, \
                np.load(runs["jax_resumed"] / "ckpt-00000050" / name) as y:
            assert all(np.array_equal(x[k], y[k]) for k in x.files)
    assert final_metrics(runs["jax", "classification"])["history"] == final_metrics(runs["jax_resumed"])["history"]


def test_a_fine_tuning_run_started_on_tensorflow_resumes_on_jax(runs):
    worst = worst_difference(last_weights(runs["tf_then_jax"]), last_weights(runs["tensorflow", "classification"]))
    print(f"switched within {worst:.2e}")
    assert worst <= 1e-4


def test_one_checkpoint_predicts_alike_on_both_backends(runs):
    with np.load(runs["predicted"]["tensorflow"]) as a, np.load(runs["predicted"]["jax"]) as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-5, err_msg=k)


def test_two_devices_of_one_process_equal_one_when_fine_tuning(runs):
    tmp, data = runs["tmp"], runs["data"]["tagging"]
    init = str(tmp / "init")
    one, two = tmp / "one-device", tmp / "two-devices"
    steps = {"max_steps": 20, "accumulation_steps": 2, "checkpoint_every": 20}
    on_backend("jax", {"finetune_runs": [finetune_spec(data, one, init, "jax", strategy="one-device", **steps)]}, tmp)
    log = on_backend("jax", {"finetune_runs": [finetune_spec(data, two, init, "jax", **steps)]}, tmp,
                     env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert "2 replica(s)" in first_line(log)
    worst = worst_difference(weights(one, 20), weights(two, 20), skip=NO_EFFECT)
    print(f"two devices within {worst:.2e}")
    assert worst <= 1e-5


def test_finetune_predict_and_eval_commands_run_on_jax_without_tensorflow(runs, tmp_path):
    from tests.trainer.test_backends import bert_train

    data, init = runs["data"]["classification"], str(runs["tmp"] / "init")
    out = tmp_path / "run"
    args = ["finetune", "--data", data, "--init-from", init, "--out", str(out), "--max-steps", "4",
            "--batch-size", "8", "--log-every", "2"]
    refused = bert_train(*args, "--backend", "jax", env={"KERAS_BACKEND": "tensorflow"})
    assert refused.returncode == 2 and "contradicts KERAS_BACKEND=tensorflow" in refused.stderr
    assert not out.exists()
    done = bert_train(*args, "--backend", "jax", without_tensorflow=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert first_line(done.stdout).endswith("Keras on jax")
    assert json.loads((out / "finetune_config.json").read_text())["backend"] == "jax"
    predicted = bert_train("predict", "--run", str(out), "--data", data, "--split", "dev",
                           "--out", str(tmp_path / "p"), "--backend", "jax", without_tensorflow=True)
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    assert (tmp_path / "p" / "predictions.tsv").is_file()
    scored = bert_train("eval", "--run", str(out), "--data", data, "--json", env={"KERAS_BACKEND": "jax"},
                        without_tensorflow=True)
    assert scored.returncode == 0, scored.stderr[-2000:]
    final = json.loads((out / "final_metrics.json").read_text())["final"]
    assert json.loads(scored.stdout)["metrics"] == final  # the run's last eval, from its checkpoint
