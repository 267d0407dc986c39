"""Feature specs of the dataset kinds: what a manifest's "features" must list, per kind.

The pre-training record layout itself is `bert_datagen.datagen.record_layout`; this module only says
which features each kind of dataset must declare.
"""

from __future__ import annotations

from bert_datagen.datagen.record_layout import MASKINGS, OBJECTIVES, feature_spec, packed_feature_spec

PRETRAINING = "pretraining"
TASK = "task"

# A manifest without "kind" is a pre-training dataset (manifests written before kinds existed).
DEFAULT_KIND = PRETRAINING

REQUIRED_FEATURES = tuple(feature_spec(1, 1))

# Features every manifest of a kind must declare at top level. Task datasets declare their full spec
# per split (docs/tasks.md); the top level holds what all splits share, so nothing is fixed here.
REQUIRED_FEATURES_BY_KIND: dict[str, tuple[str, ...]] = {
    PRETRAINING: REQUIRED_FEATURES,
    TASK: ("input_ids", "input_mask", "segment_ids"),
}

# Top-level fields a kind adds to the common ones.
REQUIRED_TOP_BY_KIND: dict[str, tuple[str, ...]] = {
    PRETRAINING: (),
    TASK: ("task",),
}



def required_features(kind: str, config: dict | None) -> tuple[str, ...]:
    """The features a manifest of `kind` must list; for pre-training data, those of the objective
    and masking its config names (manifests without them are NSP + static masking)."""
    if kind != PRETRAINING:
        return REQUIRED_FEATURES_BY_KIND[kind]
    config = config if isinstance(config, dict) else {}
    objective, masking = config.get("objective", "nsp"), config.get("masking", "static")
    if objective not in OBJECTIVES or masking not in MASKINGS:
        return REQUIRED_FEATURES
    # Packed rows (config "packing": true): bert_datagen.datagen.record_layout.packed_feature_spec.
    return tuple(feature_spec(1, 1, objective, masking, 1 if config.get("packing") else 0, word_segmented(config)))


def word_segmented(config: dict | None) -> bool:
    """Whether a pre-training config names a word segmenter (dynamic masking's records then carry
    ``word_continues_bits``: ``feature_spec``'s ``word_bits``)."""
    return isinstance(config, dict) and config.get("word_segmenter") is not None


__all__ = ["DEFAULT_KIND", "PRETRAINING", "REQUIRED_FEATURES", "REQUIRED_FEATURES_BY_KIND",
           "REQUIRED_TOP_BY_KIND", "TASK", "feature_spec", "packed_feature_spec", "required_features",
           "word_segmented"]
