"""The `random:PRESET[@SEED]` checkpoint text: dummy weights made on the device (`model.random_weights`).

Standard library only (like `model.config`): the command line, `bench gpu-run`'s option check and the manifest read
it without jax. `random:e2b` asks for the E2B preset's shapes with random weights drawn on the device in their final
(quantized) layout, seed 0; `random:e2b@7` with seed 7. No weight file is written or read; the preset's config and
the built-in checkpoints' tokenizer are cached in a small folder (`model.random_weights.ensure_random`).
"""

from __future__ import annotations

import dataclasses

from model.config import PRESETS
from model.errors import CheckpointError

RANDOM_PREFIX = "random:"
"""How `--checkpoint` asks for dummy weights."""

SEED_LIMIT = 2**32
"""Seeds are whole numbers in [0, SEED_LIMIT): jax's PRNG key takes a 32-bit seed without 64-bit mode."""

DUMMY_NOTE = "dummy weights: made on the device, no checkpoint file"
"""What a manifest and a report say about a run on dummy weights."""


@dataclasses.dataclass(frozen=True)
class RandomSpec:
    """A validated `random:` checkpoint: `preset` (a `model.config.PRESETS` name) and `seed` (0 <= seed < 2^32)."""

    preset: str
    seed: int = 0

    @property
    def text(self) -> str:
        """The canonical `--checkpoint` text: `random:PRESET` for seed 0, else `random:PRESET@SEED`."""
        return f"{RANDOM_PREFIX}{self.preset}" + (f"@{self.seed}" if self.seed else "")


def is_random(spec: object) -> bool:
    """Whether a `--checkpoint` text asks for dummy weights (starts with `random:`; it may still be malformed)."""
    return isinstance(spec, str) and spec.startswith(RANDOM_PREFIX)


def parse_random(text: str) -> RandomSpec:
    """`random:PRESET` or `random:PRESET@SEED` -> `RandomSpec`. Raises CheckpointError, one line naming the text
    received and what is expected (the presets listed), for another prefix, an unknown preset, or a seed that is
    not a whole number in [0, 2^32)."""
    presets = ", ".join(PRESETS)
    expected = f"expected random:PRESET or random:PRESET@SEED with PRESET one of {presets}"
    if not is_random(text):
        raise CheckpointError(f"{text}: not a random-weights checkpoint; {expected}")
    name, _, seed_text = text[len(RANDOM_PREFIX):].partition("@")
    if name not in PRESETS:
        raise CheckpointError(f"{text}: unknown preset {name!r}; {expected}")
    if not seed_text:
        if "@" in text:
            raise CheckpointError(f"{text}: no seed after '@'; {expected} (SEED a whole number, 0 to {SEED_LIMIT - 1})")
        return RandomSpec(name)
    if not (seed_text.isascii() and seed_text.isdigit()) or int(seed_text) >= SEED_LIMIT:
        raise CheckpointError(f"{text}: seed {seed_text!r} is not a whole number from 0 to {SEED_LIMIT - 1}; "
                              f"e.g. {RANDOM_PREFIX}{name}@1")  # fmt: skip
    return RandomSpec(name, int(seed_text))
