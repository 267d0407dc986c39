"""The options Beam's own parser defines, for the tests that check option names users write."""

from __future__ import annotations

from bert_datagen.pipelines.beam.parser import beam_parser


def beam_option_names() -> list[str]:
    return sorted(s for s in beam_parser()._option_string_actions if s.startswith("--"))
