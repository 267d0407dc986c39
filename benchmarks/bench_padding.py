"""No compute on padding (issue 24), measured: fine-tuning steps per second with length-grouped
batches vs padded-to-max on MRPC-like pairs (median ~50 tokens, max_seq_length 128), and
pre-training real (non-pad) tokens per second on packed vs unpacked rows of the same instances:
synthetic at 128, and at 512 on real text (`bert-datagen run` with and without `--packing` on
Wikipedia samples from ../shared/corpora, `--corpus-512`: English with 17% padding at 512 and
Vietnamese with 46%; each skipped with a reason when its folder is absent).

Both sides of each ratio run the trainer's own step (`finetune.train.FinetuneRun`, `pretrain.train.Run`) in
one process, on the same model size and data, timed after a warm-up that traces every batch shape.
The fine-tuning sides and the 512-token pre-training sides take their steps in turn (the shared
machine's load moves by minutes); the fine-tuning ones are compared with `transformers`'
BertForSequenceClassification of the same size on the grouped side's batches, each padded to its
longest example (its dynamic padding; torch on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

SEQ = 128
VOCAB = 1000


def mrpc_like_dataset(directory: str, n: int, seed: int = 0) -> str:
    """Sentence pairs of 12-128 tokens, median about 53 (MRPC's), as a classification task dataset."""
    from tests.support.synthetic_task import write_task_dataset

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(53), 0.35, n).astype(int), 12, SEQ)
    ids = np.zeros((n, SEQ), np.int64)
    mask, segments = np.zeros_like(ids), np.zeros_like(ids)
    for i, length in enumerate(lengths):
        ids[i, :length] = rng.integers(5, VOCAB, length)
        ids[i, 0], ids[i, length - 1] = 2, 3
        mask[i, :length] = 1
        segments[i, length // 2:length] = 1
    labels = rng.integers(0, 2, (n, 1))
    split = {"features": {"input_ids": ids, "input_mask": mask, "segment_ids": segments, "label_ids": labels,
                          "is_real_example": np.ones((n, 1), np.int64)}, "labelled": True, "mode": "train"}
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(5, VOCAB)]
    task = {"kind": "glue/mrpc", "type": "classification", "labels": ["0", "1"], "columns": {}, "max_seq_length": SEQ}
    write_task_dataset(directory, task, vocab, {"train": split})
    return directory


def finetune_stepper(data: str, out: str, model: str, batch_size: int, group_by_length: bool):
    """The trainer's own fine-tuning step on its own input, warmed up: (one-step callable, the
    step number the timing starts at, the run)."""
    import tensorflow as tf

    from bert_datagen.trainer.finetune.train import FinetuneConfig, FinetuneRun
    from bert_datagen.trainer.model.config import BertConfig
    from bert_datagen.trainer.runtime.devices import replica_slices
    from tests.support.task_fixtures import write_pretrain_run

    init = write_pretrain_run(out + "-init", BertConfig.from_name(model, VOCAB))
    cfg = FinetuneConfig(data=data, out=out, init_from=init, batch_size=batch_size, eval_split=None,
                         epochs=100, group_by_length=group_by_length)
    run = FinetuneRun(cfg, log=lambda _: None)
    next_batch, _ = run._train_input()  # what `bert-train finetune` reads: the global order's batches
    counter = [0]

    def step() -> None:
        batch = replica_slices(run.strategy, next_batch(), batch_size)
        sums = run.train_step(batch, tf.constant(1e-5), tf.constant(counter[0], tf.int64))
        float(sums["loss_sum"])  # wait for the step
        counter[0] += 1

    # Warm-up: two epochs, every bucket shape traced (outside the timing).
    warm = 2 * run.steps_per_epoch
    for _ in range(warm):
        step()
    return step, warm, run


def transformers_stepper(model: str, batches: list[dict], warm: int = 3):
    """One step of `transformers`' BertForSequenceClassification of the same size (torch, CPU,
    AdamW) per call, on `batches` in turn, each padded to its longest example (its dynamic
    padding); warmed up."""
    import torch
    from transformers import BertConfig as HFConfig
    from transformers import BertForSequenceClassification

    from bert_datagen.trainer.model.config import BertConfig

    c = BertConfig.from_name(model, VOCAB)
    net = BertForSequenceClassification(HFConfig(
        vocab_size=VOCAB, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings, type_vocab_size=c.type_vocab_size, num_labels=2))
    net.train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-5)
    feeds = []
    for b in batches:
        longest = int(b["input_mask"].sum(axis=1).max())
        feeds.append({"input_ids": torch.tensor(b["input_ids"][:, :longest], dtype=torch.long),
                      "attention_mask": torch.tensor(b["input_mask"][:, :longest], dtype=torch.long),
                      "token_type_ids": torch.tensor(b["segment_ids"][:, :longest], dtype=torch.long),
                      "labels": torch.tensor(b["label_ids"].reshape(-1), dtype=torch.long)})
    counter = [0]

    def step() -> None:
        optimizer.zero_grad()
        net(**feeds[counter[0] % len(feeds)]).loss.backward()
        optimizer.step()
        counter[0] += 1

    for _ in range(warm):
        step()
    counter[0] = 0
    return step


def interleaved_steps_per_second(steppers: dict, steps: int, block: int = 1) -> dict[str, float]:
    """Steps per second of each stepper, taking `block` steps of each in turn until each took
    `steps`: the machine's load, which moves by minutes on a shared machine, falls on all sides
    alike."""
    spent = dict.fromkeys(steppers, 0.0)
    for _ in range(0, steps, block):
        for name, step in steppers.items():
            start = time.perf_counter()
            for _ in range(block):
                step()
            spent[name] += time.perf_counter() - start
    return {name: steps // block * block / seconds for name, seconds in spent.items()}


def finetune_ratios(data: str, tmp: str, model: str, batch_size: int, steps: int, transformers: bool) -> dict:
    padded, _, _ = finetune_stepper(data, f"{tmp}/a", model, batch_size, False)
    grouped, warm, run = finetune_stepper(data, f"{tmp}/b", model, batch_size, True)
    from bert_datagen.trainer.finetune.ordered import FinetuneBatches

    # The timed steps' batches (a pure function of the step).
    again = FinetuneBatches(run.cfg.data, run.cfg.train_split, run.cfg.seed, batch_size, run.steps_per_epoch, 1, 0,
                            True)
    timed = [again.batch(warm + s) for s in range(steps)]
    rates = interleaved_steps_per_second({"padded": padded, "grouped": grouped}, steps)
    if transformers:
        # In blocks of 5, not step by step: torch's and TensorFlow's thread pools keep spinning a
        # moment after a step and slow the other framework's next step.
        hf = transformers_stepper(model, timed)
        pair = interleaved_steps_per_second({"grouped": grouped, "transformers": hf}, steps, 5)
        rates["transformers"], rates["grouped_beside_transformers"] = pair["transformers"], pair["grouped"]
    result = {"finetune_steps_per_second_padded": round(rates["padded"], 3),
              "finetune_steps_per_second_grouped": round(rates["grouped"], 3),
              "finetune_grouped_over_padded": round(rates["grouped"] / rates["padded"], 3),
              "finetune_mean_padded_length_grouped": round(float(np.mean([b["input_ids"].shape[1] for b in timed])), 1),
              "finetune_step_traces_grouped": int(run.train_step.experimental_get_tracing_count())}
    if transformers:
        result.update(finetune_steps_per_second_transformers=round(rates["transformers"], 3),
                      finetune_steps_per_second_grouped_beside_transformers=round(rates["grouped_beside_transformers"], 3),
                      finetune_grouped_over_transformers=round(rates["grouped_beside_transformers"]
                                                               / rates["transformers"], 3))
    return result


def pretraining_instances(n: int, seed: int = 0, max_pred: int = 20) -> list[dict[str, np.ndarray]]:
    """Unpacked 128-token instances, half full length and half uniform in 8..128 tokens: a padding
    share of about 0.23, as measured on English Wikipedia at 128 (issue 24)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = SEQ if rng.random() < 0.5 else int(rng.integers(8, SEQ + 1))
        ids = np.zeros(SEQ, np.int32)
        ids[:length] = rng.integers(5, VOCAB, length)
        ids[0], ids[length - 1] = 2, 3
        k = min(max_pred, max(1, round(length * 0.15)))
        pos = np.zeros(max_pred, np.int32)
        pos[:k] = np.sort(rng.choice(np.arange(1, length - 1), k, replace=False))
        weights = np.zeros(max_pred, np.float32)
        weights[:k] = 1.0
        segments = np.zeros(SEQ, np.int32)
        segments[length // 2:length] = 1
        out.append({"input_ids": ids, "input_mask": (ids > 0).astype(np.int32), "segment_ids": segments,
                    "masked_lm_positions": pos, "masked_lm_ids": ids[pos] * (weights > 0),
                    "masked_lm_weights": weights, "next_sentence_labels": np.array([rng.integers(0, 2)], np.int32)})
    return out


def first_fit_order(instances: list[dict], row_length: int, max_sequences: int) -> list[dict]:
    """The instances reordered row by row of a first-fit-decreasing packing (what a packer does
    across a shard; `pack_instances` then fills rows in this order)."""
    rows: list[list[int]] = []
    room: list[int] = []
    lengths = [int(i["input_mask"].sum()) for i in instances]
    for index in sorted(range(len(instances)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[index] <= free and len(rows[r]) < max_sequences:
                rows[r].append(index)
                room[r] -= lengths[index]
                break
        else:
            rows.append([index])
            room.append(row_length - lengths[index])
    return [instances[i] for row in rows for i in row]


def pretraining_stepper(model: str, batches: list[dict], packed: bool, vocab_size: int = VOCAB):
    """The trainer's own pre-training step on `batches` in turn, one per call, traced for each shape
    (packed rows' prediction slots compacted, as the trainer does): (one-step callable, a one-item
    list counting the real tokens it stepped over)."""
    import tensorflow as tf

    from bert_datagen.trainer.model.bert import build_model, tf1_variable_map
    from bert_datagen.trainer.model.config import BertConfig
    from bert_datagen.trainer.pretrain.config import TrainConfig
    from bert_datagen.trainer.pretrain.step import make_step_functions
    from bert_datagen.trainer.runtime.optimizer import make_optimizer

    bert = BertConfig.from_name(model, vocab_size)
    cfg = TrainConfig(data="unused", out="unused", batch_size=len(batches[0]["input_ids"]))
    strategy = tf.distribute.get_strategy()
    net = build_model(bert, seed=1)
    optimizer = make_optimizer("adamw", tf1_variable_map(net))
    train_step = make_step_functions(net, optimizer, strategy, cfg, None, packed=packed).train_step
    if packed:  # as `bert-train pretrain` feeds packed rows: only the prediction slots some row uses
        from bert_datagen.datagen.packed import compact_predictions

        unit = batches[0]["masked_lm_weights"].shape[1] // batches[0]["cls_positions"].shape[1]
        batches = [compact_predictions(b, unit) for b in batches]
    feeds = [{k: tf.constant(v) for k, v in b.items()} for b in batches]
    real = [int(b["input_mask"].sum()) for b in batches]
    traced = set()
    for feed in feeds:  # trace every shape (packed: a few slot counts) outside the timing
        if feed["masked_lm_weights"].shape not in traced:
            traced.add(feed["masked_lm_weights"].shape)
            float(train_step(feed, tf.constant(1e-5), tf.constant(0, tf.int64))["mlm_ce"])
    counter, tokens = [0], [0]

    def step() -> None:
        i = counter[0] % len(feeds)
        float(train_step(feeds[i], tf.constant(1e-5), tf.constant(counter[0] + 1, tf.int64))["mlm_ce"])
        tokens[0] += real[i]
        counter[0] += 1

    return step, tokens


def pretraining_tokens_per_second(model: str, batches: list[dict], packed: bool, steps: int,
                                  vocab_size: int = VOCAB) -> float:
    step, tokens = pretraining_stepper(model, batches, packed, vocab_size)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return tokens[0] / (time.perf_counter() - start)


def pretraining_ratio(model: str, batch_size: int, steps: int) -> dict:
    from tests.support.packed_rows import pack_instances

    instances = pretraining_instances(batch_size * steps)
    pad_share = 1.0 - sum(int(i["input_mask"].sum()) for i in instances) / (len(instances) * SEQ)
    unpacked = [{k: np.stack([i[k] for i in instances[b:b + batch_size]]) for k in instances[0]}
                for b in range(0, len(instances) - batch_size + 1, batch_size)]
    rows = pack_instances(first_fit_order(instances, SEQ, 3), SEQ, 3, 20)
    n_rows = len(rows["input_ids"])
    packed = [{k: v[b:b + batch_size] for k, v in rows.items()} for b in range(0, n_rows - batch_size + 1, batch_size)]
    plain = pretraining_tokens_per_second(model, unpacked, False, steps)
    dense = pretraining_tokens_per_second(model, packed, True, min(steps, len(packed)))
    return {"pretrain_padding_share": round(pad_share, 4), "pretrain_rows_per_instance": round(n_rows / len(instances), 3),
            "pretrain_real_tokens_per_second_unpacked": round(plain, 1),
            "pretrain_real_tokens_per_second_packed": round(dense, 1),
            "pretrain_packed_over_unpacked": round(dense / plain, 3)}


CORPORA = os.path.join("..", "shared", "corpora")
# Real text for the 512-token ratio, each in its own WikiExtractor layout: the gain is bounded by the
# padding removed, so the corpus decides it. enwiki_extract_2015's long articles leave 17% padding
# at 512; viwiki_sample's short articles (many stubs) 46%, near the ~50% of Wikipedia the issue's
# 1.7x assumes (padding shares of every corpus: docs/packing.md).
CORPORA_512 = {"enwiki": ("enwiki_extract_2015", ["wiki_00"]), "viwiki": ("viwiki_sample", ["wiki_00"]),
               "zhwiki": ("zhwiki_sample", ["wiki_00"])}
REAL_SEQ = 512


def _datagen(*args: str) -> None:
    # A child process: the Beam pipeline's threads and imports stay out of the timed process.
    done = subprocess.run([sys.executable, "-c", "from bert_datagen.pipelines.cli import main; main()", *args],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"bert-datagen {args[0]} failed: {done.stderr.strip()[-2000:]}")


def _read_dataset(directory: str) -> dict[str, np.ndarray]:
    """Every train record of a dataset (packed or not), as the trainer's int32/float32 arrays."""
    import tensorflow as tf

    with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    features = {k: v for k, v in manifest["features"].items() if k != "instance_key"}
    spec = {k: tf.io.FixedLenFeature([n], tf.int64 if t == "int64" else tf.float32) for k, (t, n) in features.items()}
    files = [os.path.join(directory, s["path"]) for s in manifest["splits"]["train"]["shards"]]
    records = [r for r in tf.data.TFRecordDataset(files)]
    parsed = tf.io.parse_example(tf.stack(records), spec)
    return {k: v.numpy().astype(np.int32) if v.dtype == tf.int64 else v.numpy() for k, v in parsed.items()}


def real_text_batches(directory: str, batch_size: int, corpus: str) -> tuple[list[dict], list[dict], int]:
    """The same 512-token instances of a Wikipedia sample (CORPORA_512), unpacked and packed
    (`--packing`, up to 3 sequences a row), as full batches of `batch_size` records or rows; and the
    vocab size (a vocab of up to 8,000 pieces trained on the same text)."""
    folder, names = CORPORA_512[corpus]
    inputs = [a for name in names for a in ("--input", os.path.join(CORPORA, folder, name))]
    vocab = os.path.join(directory, "vocab.txt")
    _datagen("vocab", *inputs, "--output", vocab, "--vocab-size", "8000", "--input-format", "wikiextractor")
    common = [*inputs, "--vocab", vocab, "--input-format", "wikiextractor", "--max-seq-length", str(REAL_SEQ),
              "--max-predictions-per-seq", "80", "--dupe-factor", "1", "--num-shards", "1"]
    sides = []
    for name, extra in (("unpacked", []), ("packed", ["--packing"])):
        _datagen("run", *common, "--output", os.path.join(directory, name), *extra)
        records = _read_dataset(os.path.join(directory, name))
        n = len(records["input_ids"])
        sides.append([{k: v[b:b + batch_size] for k, v in records.items()}
                      for b in range(0, n - batch_size + 1, batch_size)])
    with open(vocab, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    return sides[0], sides[1], vocab_size


def _spread(batches: list[dict], n: int) -> list[dict]:
    """`n` batches evenly spread over the whole list (all of them when n >= its length)."""
    if n >= len(batches):
        return batches
    return [batches[i * len(batches) // n] for i in range(n)]


def real_text_ratio(model: str, batch_size: int, directory: str, steps: int = 16, corpus: str = "enwiki",
                    block: int = 1) -> dict:
    """Packed over unpacked real tokens per second at 512 on `corpus` (its figures are named
    pretrain_512_*, pretrain_512_<corpus>_* for any but enwiki). Both sides hold the same
    instances; a full pass over them takes minutes on 2 cores, so each side times `steps` batches
    spread evenly over its pass (the same mix of documents and lengths), `block` steps of each side
    in turn: the shared machine's load moves by minutes and must fall on both sides alike."""
    steps = max(block, steps // block * block)  # whole blocks: each side steps over each batch once
    prefix = "pretrain_512_" if corpus == "enwiki" else f"pretrain_512_{corpus}_"
    folder = os.path.join(CORPORA, CORPORA_512[corpus][0])
    if not os.path.isdir(folder):
        return {f"{prefix}skipped": f"{folder} is absent (real text needed)"}
    unpacked, packed, vocab_size = real_text_batches(directory, batch_size, corpus)
    instances = len(unpacked) * batch_size
    sides = {"unpacked": pretraining_stepper(model, _spread(unpacked, steps), False, vocab_size),
             "packed": pretraining_stepper(model, _spread(packed, steps), True, vocab_size)}
    for step, tokens in sides.values():  # warm-up: one untimed step each past the trace
        step()
        tokens[0] = 0
    rates = interleaved_steps_per_second({name: step for name, (step, _) in sides.items()}, steps, block)
    # Steps per second x real tokens per step: each side took `steps` steps over its own batches.
    plain = rates["unpacked"] * sides["unpacked"][1][0] / steps
    dense = rates["packed"] * sides["packed"][1][0] / steps
    real = sum(int(b["input_mask"].sum()) for b in unpacked)
    figures = {"model": model, "instances": instances,
               "padding_share": round(1.0 - real / (instances * REAL_SEQ), 4),
               "rows_per_instance": round(len(packed) / len(unpacked), 3),
               "real_tokens_per_second_unpacked": round(plain, 1),
               "real_tokens_per_second_packed": round(dense, 1),
               "packed_over_unpacked": round(dense / plain, 3)}
    return {prefix + k: v for k, v in figures.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="mini")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-pretraining", action="store_true", help="only the fine-tuning ratio")
    parser.add_argument("--no-finetuning", action="store_true", help="only the pre-training ratios")
    parser.add_argument("--model-512", default="mini", help="model size of the 512-token pre-training ratio")
    parser.add_argument("--batch-size-512", type=int, default=8)
    parser.add_argument("--no-transformers", action="store_true",
                        help="skip the comparison with transformers' dynamic padding (needs torch)")
    parser.add_argument("--steps-512", type=int, default=16)
    parser.add_argument("--no-512", action="store_true", help="skip the 512-token real-text ratios")
    parser.add_argument("--corpus-512", nargs="+", choices=sorted(CORPORA_512), default=["enwiki", "viwiki"],
                        help="real text of the 512-token ratios, one ratio each")
    args = parser.parse_args(argv or [])
    result: dict = {"model": args.model, "batch_size": args.batch_size, "max_seq_length": SEQ}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_pretraining and not args.no_512:
            for corpus in args.corpus_512:
                result.update(real_text_ratio(args.model_512, args.batch_size_512, f"{tmp}/real-{corpus}",
                                              args.steps_512, corpus))
        if args.no_finetuning:
            result.update(pretraining_ratio(args.model, args.batch_size, args.steps))
            print(json.dumps(result, indent=2))
            return result
        data = mrpc_like_dataset(f"{tmp}/mrpc", 20 * args.batch_size)
        lengths = []
        import tensorflow as tf

        for record in tf.data.TFRecordDataset(f"{tmp}/mrpc/train/part-00000-of-00001.tfrecord"):
            ex = tf.train.Example.FromString(record.numpy())
            lengths.append(sum(ex.features.feature["input_mask"].int64_list.value))
        result["median_tokens"] = float(np.median(lengths))
        result.update(finetune_ratios(data, tmp, args.model, args.batch_size, args.steps, not args.no_transformers))
    if not args.no_pretraining:
        result.update(pretraining_ratio(args.model, args.batch_size, args.steps))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
