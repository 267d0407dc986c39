"""`bert-datagen batches`: which records a training step reads (or one rank's share of it): the
global batch of pre-training's order (unpacked or packed rows, static or dynamic masking), or
fine-tuning's batch of a task split (its epochs; `--group-by-length` as `bert-train finetune` groups),
through the same readers the trainers use (`contract/loading/kinds.py`)."""

from __future__ import annotations

import json

import click
import numpy as np

from bert_datagen.cli.plumbing import Int, refuse_unused_options
from bert_datagen.contract.bounds import MAX_SEED, ArgumentError
from bert_datagen.contract.features import TASK
from bert_datagen.contract.loading.mixture import DEFAULT_MIX_WINDOW, MixtureError, parse_weights
from bert_datagen.contract.loading.order import DEFAULT_BLOCK_SIZE, GlobalOrder, check_order, check_step
from bert_datagen.contract.loading.source import LoadError, Source, open_source
from bert_datagen.contract.loading.split_records import SplitRecords
from bert_datagen.contract.loading.task_batches import TaskBatches
from bert_datagen.datagen.record_layout import INSTANCE_KEY
from bert_datagen.pipelines.beam import fsio

INSTANCE_KEYS = "instance_keys"  # a packed row's: one per sequence


def batch_records(source: Source, seed: int, batch_size: int, step: int, world_size: int = 1, rank: int = 0,
                  block_size: int = DEFAULT_BLOCK_SIZE, group_by_length: bool = False) -> list[dict]:
    """One dict per record of the share, in batch order: position, epoch, shard, index, and what
    names the record's content: its instance key (dynamic masking), the instance keys of a packed
    row's sequences, or (task data) the batch's padded length."""
    if source.kind == TASK:
        reader = TaskBatches(source, seed=seed, batch_size=batch_size, world_size=world_size, rank=rank,
                             group_by_length=group_by_length)
        positions = reader.positions_at(step)
        order = reader.order
        width = int(reader.batch_at(step)["input_ids"].shape[1])
    else:
        order = GlobalOrder(source.counts, source.fingerprint, seed, batch_size, block_size)
        positions = order.batch_positions(step, world_size, rank)
    placed = order.place(positions)
    keys = None
    if source.has_instance_key:
        split = np.concatenate([[0], np.cumsum(source.counts)])
        records = SplitRecords(source)[(split[placed.shard] + placed.index).tolist()]
        keys = records[INSTANCE_KEY].view(np.uint64)  # the identity as the unsigned 64-bit key it is
        if "sequence_ids" in records:  # packed rows: the keys of the row's sequences, slot by slot
            present = records["sequence_ids"].max(axis=1)
            keys = [row[:n].tolist() for row, n in zip(keys, present.tolist(), strict=True)]
        else:
            keys = keys[:, 0].tolist()
    rows = []
    for i, (pos, epoch, shard, index) in enumerate(zip(positions.tolist(), placed.epoch.tolist(),
                                                       placed.shard.tolist(), placed.index.tolist(), strict=True)):
        row = {"position": pos, "epoch": epoch, "shard": source.shards[shard].name, "shard_number": shard,
               "index": index}
        if source.kind == TASK:
            row["length"] = width
        if keys is not None:
            row[INSTANCE_KEYS if isinstance(keys[i], list) else INSTANCE_KEY] = keys[i]
        rows.append(row)
    return rows


@click.command("batches")
@click.argument("target")
@click.option("--seed", type=Int(0, MAX_SEED), required=True, help="The training run's seed.")
@click.option("--batch-size", type=Int(1), required=True, help="Global batch size.")
@click.option("--step", type=Int(0), required=True, help="Global batch (0-based step).")
@click.option("--world-size", type=Int(1), default=1, show_default=True,
              help="Ranks the global batch is split over.")
@click.option("--rank", type=Int(0), default=0, show_default=True, help="Rank whose share to show.")
@click.option("--split", default="train", show_default=True, help="Split the run reads.")
@click.option("--block-size", type=Int(1), default=DEFAULT_BLOCK_SIZE, show_default=True,
              help="Records per block of the order (as the run's loader was given).")
@click.option("--mix", "mix", multiple=True, metavar="DATASET",
              help="Another dataset mixed with TARGET (repeatable; with --weights): each record shows its dataset.")
@click.option("--weights", default=None, metavar="W1,W2,...", help="Mixture weights, TARGET's first.")
@click.option("--mix-window", type=Int(1), default=DEFAULT_MIX_WINDOW, show_default=True,
              help="Positions per mixture window (as the run's mixture was given).")
@click.option("--group-by-length", is_flag=True,
              help="Task data: the run groups by length (bert-train finetune --group-by-length).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def batches_command(ctx, target, seed, batch_size, step, world_size, rank, split, block_size, mix, weights,
                    mix_window, group_by_length, as_json) -> None:
    """Which records training step STEP of a run over TARGET reads (docs/loading.md): pre-training's
    global batch STEP, or fine-tuning's batch of step STEP for a task dataset (its epochs, length
    groups); shard, index in the shard, instance keys; with --world-size/--rank, that rank's share;
    with --mix/--weights, of a weighted mixture of TARGET and the other datasets, each record with
    the dataset it came from."""
    if bool(mix) != (weights is not None):
        raise click.UsageError("--mix and --weights go together: the other datasets and one weight per dataset")
    if rank >= world_size:
        raise click.BadParameter(f"rank {rank} is not below the world size {world_size}", param_hint="--rank")
    if batch_size % world_size:
        raise click.BadParameter(f"the batch size {batch_size} is not a multiple of the world size {world_size}",
                                 param_hint="--batch-size")
    try:  # the bounds that depend on the batch size: the order's own checks, named as options
        check_order(seed, batch_size, block_size)
        check_step(step, batch_size)
    except ArgumentError as e:
        raise click.BadParameter(str(e), param_hint=f"--{e.argument.replace('_', '-')}") from e
    if not mix:
        refuse_unused_options(ctx, {"mix_window": "only a mixture (--mix, --weights) is cut into windows"})
    if mix:
        refuse_unused_options(ctx, {"group_by_length": "a mixture is pre-training data"})
        return _mixture(target, mix, weights, seed, batch_size, step, world_size, rank, split, block_size, mix_window,
                        as_json)
    try:
        source = open_source(target, split, fsio.BEAM_FS)
        if source.kind == TASK:
            refuse_unused_options(ctx, {"block_size": "fine-tuning's order reads blocks of one record"})
        else:
            refuse_unused_options(ctx, {"group_by_length": "length grouping is fine-tuning's (task datasets)"})
        if sum(source.counts) < batch_size:
            raise LoadError(f"{target}: the {split} split has {sum(source.counts)} records, fewer than one "
                            f"batch of {batch_size}")
        rows = batch_records(source, seed, batch_size, step, world_size, rank, block_size, group_by_length)
    except LoadError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps({"dataset": target, "split": split, "kind": source.kind, "seed": seed,
                               "batch_size": batch_size, "block_size": 1 if source.kind == TASK else block_size,
                               "group_by_length": group_by_length, "step": step, "world_size": world_size, "rank": rank,
                               "fingerprint": source.fingerprint, "records": rows}))
        return
    share = f", rank {rank} of {world_size}" if world_size > 1 else ""
    if source.kind == TASK:
        per_epoch = sum(source.counts) // batch_size
        what = (f"step {step} (batch {step % per_epoch} of epoch {step // per_epoch}, {per_epoch} an epoch"
                f"{', grouped by length' if group_by_length else ''}; padded to {rows[0]['length']} tokens)")
    else:
        what = f"global batch {step}"
    click.echo(f"{what} of {target} (split {split}, seed {seed}, batch size {batch_size}, "
               f"block size {1 if source.kind == TASK else block_size}{share}): {len(rows)} records")
    key = next((k for k in (INSTANCE_KEY, INSTANCE_KEYS) if rows and k in rows[0]), None)
    click.echo("position  epoch  shard  index" + (f"  {key}" if key else ""))
    for r in rows:
        line = f"{r['position']}  {r['epoch']}  {r['shard']}  {r['index']}"
        if key == INSTANCE_KEY:
            line += f"  {r[key]:016x}"
        elif key:
            line += "  " + ",".join(f"{k:016x}" for k in r[key])
        click.echo(line)


def _mixture(target, mix, weights, seed, batch_size, step, world_size, rank, split, block_size, window,
             as_json) -> None:
    from bert_datagen.pipelines.tools.batches_mix import mixture_records

    paths = [target, *mix]
    try:
        parsed = parse_weights(weights, len(paths))
    except MixtureError as e:
        raise click.BadParameter(str(e), param_hint="--weights") from e
    try:
        sources = [open_source(p, split, fsio.BEAM_FS) for p in paths]
        rows = mixture_records(sources, parsed, seed, batch_size, step, world_size, rank, block_size, window)
    except (LoadError, MixtureError) as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps({"datasets": paths, "weights": parsed, "mix_window": window, "split": split,
                               "seed": seed, "batch_size": batch_size, "block_size": block_size, "step": step,
                               "world_size": world_size, "rank": rank, "records": rows}))
        return
    share = f", rank {rank} of {world_size}" if world_size > 1 else ""
    mixed = ", ".join(f"{p} ({w:g})" for p, w in zip(paths, parsed, strict=True))
    click.echo(f"global batch {step} of the mixture {mixed} "
               f"(split {split}, seed {seed}, batch size {batch_size}, block size {block_size}{share}): "
               f"{len(rows)} records")
    key = INSTANCE_KEY in (rows[0] if rows else {})
    click.echo("position  dataset  dataset_position  epoch  shard  index" + ("  instance_key" if key else ""))
    for r in rows:
        line = f"{r['position']}  {r['dataset_path']}  {r['dataset_position']}  {r['epoch']}  {r['shard']}  {r['index']}"
        click.echo(line + (f"  {r[INSTANCE_KEY]:016x}" if key else ""))
