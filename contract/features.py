"""Feature specs of the dataset kinds: what a manifest's "features" must list, per kind.

The pre-training record layout itself is built where records are encoded (`datagen.records`); this
module only says which features each kind of dataset must declare.
"""

from __future__ import annotations

from datagen.records import feature_spec

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

__all__ = ["DEFAULT_KIND", "PRETRAINING", "REQUIRED_FEATURES", "REQUIRED_FEATURES_BY_KIND",
           "REQUIRED_TOP_BY_KIND", "TASK", "feature_spec"]
