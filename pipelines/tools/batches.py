"""`bert-datagen batches`: which records a global batch of the loaders' order holds (or one rank's
share of it), without reading more than the records' instance keys."""

from __future__ import annotations

import json

import click

from bert_datagen.contract.cli.plumbing import Int
from bert_datagen.contract.loading.mixture import DEFAULT_MIX_WINDOW, MixtureError, parse_weights
from bert_datagen.contract.loading.order import DEFAULT_BLOCK_SIZE, GlobalOrder, check_order, check_step
from bert_datagen.contract.loading.source import LoadError, Source, open_source
from bert_datagen.contract.ranges import MAX_SEED, ArgumentError
from bert_datagen.datagen.records import INSTANCE_KEY
from bert_datagen.pipelines.beam import fsio


def batch_records(source: Source, seed: int, batch_size: int, step: int, world_size: int = 1, rank: int = 0,
                  block_size: int = DEFAULT_BLOCK_SIZE) -> list[dict]:
    """One dict per record of the share, in batch order: position, epoch, shard, index, instance key."""
    order = GlobalOrder(source.counts, source.fingerprint, seed, batch_size, block_size)
    positions = order.batch_positions(step, world_size, rank)
    placed = order.place(positions)
    rows = []
    for pos, epoch, shard, index in zip(positions.tolist(), placed.epoch.tolist(), placed.shard.tolist(),
                                        placed.index.tolist(), strict=True):
        row = {"position": pos, "epoch": epoch, "shard": source.shards[shard].name, "shard_number": shard,
               "index": index}
        if source.has_instance_key:
            key = int(source.read(shard, index, index + 1)[INSTANCE_KEY][0, 0])
            row[INSTANCE_KEY] = key & ((1 << 64) - 1)  # the identity as the unsigned 64-bit key it is
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
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def batches_command(target, seed, batch_size, step, world_size, rank, split, block_size, mix, weights, mix_window,
                    as_json) -> None:
    """Which records global batch STEP of a run over TARGET holds (docs/loading.md): shard, index in
    the shard, instance key; with --world-size/--rank, that rank's share; with --mix/--weights, of
    a weighted mixture of TARGET and the other datasets, each record with the dataset it came from."""
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
    if mix:
        return _mixture(target, mix, weights, seed, batch_size, step, world_size, rank, split, block_size, mix_window,
                        as_json)
    try:
        source = open_source(target, split, fsio.BEAM_FS)
        if sum(source.counts) < batch_size:
            raise LoadError(f"{target}: the {split} split has {sum(source.counts)} records, fewer than one "
                            f"batch of {batch_size}")
        rows = batch_records(source, seed, batch_size, step, world_size, rank, block_size)
    except LoadError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps({"dataset": target, "split": split, "seed": seed, "batch_size": batch_size,
                               "block_size": block_size, "step": step, "world_size": world_size, "rank": rank,
                               "fingerprint": source.fingerprint, "records": rows}))
        return
    share = f", rank {rank} of {world_size}" if world_size > 1 else ""
    click.echo(f"global batch {step} of {target} (split {split}, seed {seed}, batch size {batch_size}, "
               f"block size {block_size}{share}): {len(rows)} records")
    key = INSTANCE_KEY in (rows[0] if rows else {})
    click.echo("position  epoch  shard  index" + ("  instance_key" if key else ""))
    for r in rows:
        line = f"{r['position']}  {r['epoch']}  {r['shard']}  {r['index']}"
        click.echo(line + (f"  {r[INSTANCE_KEY]:016x}" if key else ""))


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
