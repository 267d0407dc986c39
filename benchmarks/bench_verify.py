"""`bert-datagen verify` throughput against plain sha256 of the same files, measured in one run.

The dataset is synthetic (valid BERT records with the recipe's layout and masking, written through
bert_datagen.datagen.records and bert_datagen.contract.manifest), so the benchmark needs no corpus and no pipeline run.
``make_dataset`` is also the fixture writer of the tools tests.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time

import numpy as np

from bert_datagen.contract.manifest import VOCAB_NAME, Manifest
from bert_datagen.datagen import rng
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.record_layout import feature_spec
from bert_datagen.datagen.records import InstanceBatch
from bert_datagen.datagen.tfrecord import frame_records
from bert_datagen.pipelines.beam import fsio
from bert_datagen.pipelines.tools.card import write_card
from tests.support.record_encoding import encode_batch

SPECIALS = ["[PAD]"] + [f"[unused{i}]" for i in range(5)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = 0, 6, 7, 8, 9


def fixture_vocab(n_words: int = 400) -> list[str]:
    """A small BERT-shaped vocab: specials, made-up words, then ## pieces."""
    syll = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "gu", "fa", "ve"]
    words = []
    for i in range(n_words):
        a, b, c = syll[i % 12], syll[(i // 12) % 12], syll[(i // 144) % 12]
        words.append(a + b + (c if i >= 144 else ""))
    return SPECIALS + words + ["##s", "##ed", "##ing", "##ly"]


def fixture_instances(seed: int, first: int, n: int, max_seq_length: int, max_predictions: int,
                      vocab_size: int) -> tuple[InstanceBatch, np.ndarray]:
    """Records first..first+n-1 of a synthetic dataset, and their original (unmasked) input_ids.

    Every draw comes from bert_datagen.datagen.rng keyed by (seed, record number), so any record can be rebuilt.
    """
    s, p = max_seq_length, max_predictions
    keys = np.array([rng.derive_key(seed, "tools-fixture", first + i) for i in range(n)], np.uint64)
    draws = rng.u64_for_keys(keys[:, None], np.arange(1, 4 + 2 * s + 2 * p, dtype=np.uint64)[None, :])
    word_lo = len(SPECIALS)
    ar = np.arange(s)
    length = 5 + (draws[:, 0] % np.uint64(s - 4)).astype(np.int64)  # 5..s
    a_len = 1 + (draws[:, 1] % (length - 4).astype(np.uint64)).astype(np.int64)  # A, B >= 1 token
    sep1 = 1 + a_len
    words = word_lo + (draws[:, 3:3 + s] % np.uint64(vocab_size - word_lo)).astype(np.int64)
    inside = ar < length[:, None]
    original = np.where(inside, words, 0)
    original[:, 0] = CLS
    original[np.arange(n), sep1] = SEP
    original[np.arange(n), length - 1] = SEP
    segment = ((ar > sep1[:, None]) & inside).astype(np.int64)
    # Masking: candidates are real tokens except [CLS]/[SEP]; take the k with the smallest draw.
    score = draws[:, 3 + s:3 + 2 * s].copy()
    cand = inside & (ar > 0) & (ar != sep1[:, None]) & (ar != (length - 1)[:, None])
    score[~cand] = np.iinfo(np.uint64).max
    k = np.minimum(p, np.maximum(1, np.rint(length * 0.15).astype(np.int64)))
    chosen = np.argsort(score, axis=1, kind="stable")[:, :p]
    active = np.arange(p) < k[:, None]
    positions = np.where(active, np.sort(np.where(active, chosen, s), axis=1), 0)
    positions = np.where(active, positions, 0)
    labels = np.where(active, np.take_along_axis(original, positions, axis=1), 0)
    kind = draws[:, 3 + 2 * s:3 + 2 * s + p] % np.uint64(10)
    rand_ids = (draws[:, 3 + 2 * s + p:3 + 2 * s + 2 * p] % np.uint64(vocab_size)).astype(np.int64)
    new = np.where(kind < 8, MASK, np.where(kind < 9, labels, rand_ids))
    input_ids = original.copy()
    rows, cols = np.nonzero(active)
    input_ids[rows, positions[rows, cols]] = new[rows, cols]
    nsp = (draws[:, 2] & np.uint64(1)).astype(np.int64)
    batch = InstanceBatch(
        input_ids=input_ids,
        input_mask=inside.astype(np.int64),
        segment_ids=segment,
        masked_lm_positions=positions,
        masked_lm_ids=labels,
        masked_lm_weights=active.astype(np.float32),
        next_sentence_labels=nsp,
    )
    return batch, original


def make_dataset(out_dir: str, *, seed: int = 12345, records: int = 200, shards: int = 2,
                 eval_records: int = 0, max_seq_length: int = 64, max_predictions: int = 10,
                 batch_records: int = 4096) -> Manifest:
    """Write a complete synthetic dataset (shards, vocab.txt, README.md, manifest.json last)."""
    vocab = fixture_vocab()
    vocab_bytes = ("\n".join(vocab) + "\n").encode()
    fsio.write_atomic(fsio.join(out_dir, VOCAB_NAME), vocab_bytes)
    config = DatagenConfig(max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions,
                           random_seed=seed, num_shards=shards)
    splits: dict[str, dict] = {}
    totals = {"instances": 0, "masked_tokens": 0, "notnext": 0}
    first = 0
    for split, count in (("train", records), ("eval", eval_records)):
        if count == 0 and split == "eval":
            continue
        n_shards = shards if split == "train" else 1
        entries = []
        bounds = np.linspace(0, count, n_shards + 1).astype(int)
        for i in range(n_shards):
            rel = f"{split}/part-{i:05d}-of-{n_shards:05d}.tfrecord"
            parts = []
            for lo in range(int(bounds[i]), int(bounds[i + 1]), batch_records):
                hi = min(lo + batch_records, int(bounds[i + 1]))
                batch, _ = fixture_instances(seed, first + lo, hi - lo, max_seq_length, max_predictions, len(vocab))
                parts.append(frame_records(encode_batch(batch)))
                totals["masked_tokens"] += int(batch.masked_lm_weights.sum())
                totals["notnext"] += int(batch.next_sentence_labels.sum())
            data = b"".join(parts)
            fsio.write_atomic(fsio.join(out_dir, split, rel.split("/")[1]), data)
            entries.append({"path": rel, "records": int(bounds[i + 1] - bounds[i]), "bytes": len(data),
                            "sha256": hashlib.sha256(data).hexdigest()})
        splits[split] = {"shards": entries}
        totals["instances"] += count
        first += count
    notnext = totals.pop("notnext")
    totals["notnext_fraction"] = notnext / max(1, totals["instances"])
    manifest = Manifest.build(
        config=config.to_dict(),
        vocab={"path": VOCAB_NAME, "sha256": hashlib.sha256(vocab_bytes).hexdigest(), "size": len(vocab),
               "do_lower_case": True},
        input_info={"patterns": ["<synthetic>"], "files": 0, "bytes": 0, "fingerprint": f"synthetic-{seed}"},
        features=feature_spec(max_seq_length, max_predictions),
        splits=splits,
        totals=totals,
        created_by={"writer": "benchmarks.bench_verify.make_dataset"},
    )
    write_card(out_dir, manifest)
    manifest.write(out_dir, fsio.BEAM_FS)
    return manifest


def _sha256_files(paths: list[str]) -> float:
    t0 = time.perf_counter()
    for path in paths:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(4 << 20):
                h.update(chunk)
    return time.perf_counter() - t0


def _peak_rss_mb(args: list[str]) -> float:
    """Peak resident memory (MB) of a fresh process running `bert-datagen ARGS`."""
    import subprocess

    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent across exec.
    code = ("import sys\nfrom bert_datagen.pipelines.cli import main\ntry:\n    main(sys.argv[1:])\nfinally:\n"
            "    hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0]\n"
            "    print('PEAK_RSS_KB', hwm.split()[1])\n")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True).stdout
    return int(out.rsplit("PEAK_RSS_KB", 1)[1].split()[0]) / 1024


def main(records: int = 60_000, shards: int = 4) -> dict:
    from bert_datagen.contract.dataset import open_dataset
    from bert_datagen.pipelines.beam.fsio import BEAM_FS
    from bert_datagen.pipelines.tools.verify import verify

    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        t0 = time.perf_counter()
        manifest = make_dataset(tmp, records=records, shards=shards, max_seq_length=128, max_predictions=20)
        gen_s = time.perf_counter() - t0
        paths = [os.path.join(tmp, s.path) for s in manifest.splits["train"].shards]
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        sha_s = _sha256_files(paths)  # also warms the page cache for the runs below
        sha_s = min(sha_s, _sha256_files(paths))
        ds = open_dataset(tmp, BEAM_FS)
        rows = []
        figures: dict[str, float] = {"dataset_mb": round(mb, 1), "records": records, "generate_s": round(gen_s, 2),
                                     "sha256_mb_s": round(mb / sha_s, 1)}
        cores = os.cpu_count() or 1
        for label, workers, check in (("verify, hashes+framing only, 1 proc", 1, False),
                                      ("verify, full, 1 proc", 1, True),
                                      (f"verify, full, {cores} procs", cores, True)):
            t, c = time.perf_counter(), time.process_time()
            report = verify(ds, workers=workers, check_records=check)
            secs = time.perf_counter() - t
            if workers == 1:  # CPU time: what one core costs, less disturbed by other load
                figures[f"verify_{'full' if check else 'hash_only'}_cpu_mb_s_per_core"] = round(
                    mb / (time.process_time() - c), 1)
            if not report.ok:
                raise RuntimeError("benchmark dataset did not verify: " + "; ".join(report.problems[:3]))
            rows.append((label, secs, mb / secs))
        figures["verify_hash_only_mb_s"] = round(rows[0][2], 1)
        figures["verify_1proc_mb_s"] = round(rows[1][2], 1)
        figures["verify_allcores_mb_s"] = round(rows[2][2], 1)
        figures["verify_allcores_records_s"] = round(records / rows[2][1])
        figures["cores"] = cores
        figures["ratio_verify_allcores_to_sha256"] = round(rows[2][2] / (mb / sha_s), 3)
        # Constant memory: the peak of a one-process verify hardly moves when the shard is 4x larger.
        small = os.path.join(tmp, "mem-small")
        make_dataset(small, records=records // 2, shards=1, max_seq_length=128, max_predictions=20)
        big = os.path.join(tmp, "mem-big")
        make_dataset(big, records=records * 2, shards=1, max_seq_length=128, max_predictions=20)
        cmd = ["verify", "--workers", "1"]
        figures["verify_peak_rss_mb_small_shard"] = round(_peak_rss_mb(cmd + [small]), 1)
        figures["verify_peak_rss_mb_4x_shard"] = round(_peak_rss_mb(cmd + [big]), 1)
        figures["mem_shard_mb_small"] = round(os.path.getsize(
            os.path.join(small, "train", "part-00000-of-00001.tfrecord")) / 1e6, 1)
    print(f"dataset: {records} records, {mb:.1f} MB in {shards} shards (generated in {gen_s:.1f} s)")
    print(f"{'what':<42}{'seconds':>9}{'MB/s':>9}")
    print(f"{'plain hashlib.sha256, 1 proc':<42}{sha_s:>9.2f}{mb / sha_s:>9.1f}")
    for label, secs, rate in rows:
        print(f"{label:<42}{secs:>9.2f}{rate:>9.1f}")
    print(f"CPU time per core: full verify {figures['verify_full_cpu_mb_s_per_core']} MB/s, hashes+framing "
          f"{figures['verify_hash_only_cpu_mb_s_per_core']} MB/s")
    print(f"full verify on all cores runs at {figures['ratio_verify_allcores_to_sha256']:.2f}x plain sha256")
    print(f"peak RSS of a 1-process verify: {figures['verify_peak_rss_mb_small_shard']} MB on a "
          f"{figures['mem_shard_mb_small']} MB shard, {figures['verify_peak_rss_mb_4x_shard']} MB on one 4x larger")
    return figures


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
