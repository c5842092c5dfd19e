"""How long a prompt an engine takes, from the model's config alone: the bucket ladder, the largest prompt, the
model's positions, and the checks a request must pass. No jax and no weights (wall 5, pyproject.toml).

`model.engine.Engine` holds one `PromptLimits` (`Engine.limits`) and checks every request against it; a command
line builds the same limits from config.json (`max_position_embeddings`) and its flags (`--max-length`,
`--buckets`) and checks its `--inputs` before the weights load, so a size no engine could take is one line, not
a load of gigabytes first. Errors are EngineError (model/errors.py), each naming the value, the limit and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from model.errors import EngineError

DEFAULT_BUCKETS = (32, 64, 128, 256, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192)
"""Default prompt-length ladder: powers of two up to the sliding window, then steps of 512 (a window) to 4096,
then steps of 1024: fine where padding would dominate, coarser where prefill is long anyway."""
DEFAULT_MAX_LENGTH = 8192
"""The largest prompt (tokens) without --max-length or --buckets, or the model's positions if fewer."""


def bucket_ladder(max_length: int, base: Sequence[int] = DEFAULT_BUCKETS) -> tuple[int, ...]:
    """The ladder rungs below `max_length`, plus `max_length` itself as the top rung."""
    rungs = [b for b in base if b < max_length]
    return tuple(rungs + [max_length])


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptLimits:
    """The prompt lengths an engine takes (tokens).

    `positions`: the model's max_position_embeddings (prompt + new tokens never exceed it); `buckets`: the ladder,
    increasing (a prompt is padded to the smallest rung that holds it); `max_length`: the largest prompt a request
    may have; `explicit_buckets`: True when the ladder was given (`--buckets`), so a fix names that flag, else
    `--max-length`. Build one with `prompt_limits`.
    """

    positions: int
    buckets: tuple[int, ...]
    max_length: int
    explicit_buckets: bool = False

    def bucket_for(self, n_tokens: int) -> int:
        """The smallest bucket >= n_tokens. Raises EngineError naming the limit and a fix that can work: the flag
        that raises it, up to the model's positions (max_position_embeddings), or, for a prompt above those, that
        no flag can hold it."""
        if n_tokens < 1:
            raise EngineError(f"a prompt needs at least 1 token, got {n_tokens}")
        for b in self.buckets:
            if b >= n_tokens:
                return b
        positions = self.positions
        if n_tokens >= positions:  # a prompt needs room for at least one new token too
            fix = (f"the model has {positions} positions (max_position_embeddings), the real limit, which neither "
                   f"--max-length nor --buckets can exceed; use a prompt of fewer than {positions} tokens")
        elif self.explicit_buckets:
            fix = f"add a bucket of {n_tokens}..{positions - 1} tokens to --buckets (the model's {positions} positions)"
        else:
            fix = f"raise it with --max-length {n_tokens}..{positions} (the model's positions)"
        raise EngineError(f"prompt of {n_tokens} tokens exceeds the engine's largest bucket {self.buckets[-1]}; {fix}")

    def check_request(self, n_tokens: int, max_new_tokens: int) -> int:
        """The bucket of a request of `n_tokens` prompt tokens and `max_new_tokens` new ones. Raises EngineError
        (naming the limit and the flag that changes it) when no bucket holds the prompt, max_new_tokens < 1, or
        prompt + new tokens exceed the model's positions (max_position_embeddings)."""
        if max_new_tokens < 1:
            raise EngineError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        bucket = self.bucket_for(n_tokens)
        if n_tokens + max_new_tokens > self.positions:
            raise EngineError(
                f"{n_tokens} prompt tokens + {max_new_tokens} new tokens exceed the model's "
                f"{self.positions} positions (max_position_embeddings); lower --max-new-tokens"
            )
        return bucket


def prompt_limits(positions: int, *, max_length: int | None = None,
                  buckets: Sequence[int] | None = None) -> PromptLimits:  # fmt: skip
    """The limits of an engine of a model with `positions` positions (max_position_embeddings), given
    `--max-length` (`max_length`; default: the largest bucket given, else `DEFAULT_MAX_LENGTH` or the model's
    positions if fewer) and `--buckets` (`buckets`; default: `bucket_ladder(max_length)`). Raises EngineError for
    a bucket above max_length, or a largest bucket above the model's positions."""
    if buckets and max_length and max(buckets) > max_length:
        raise EngineError(f"bucket {max(buckets)} is above --max-length {max_length}; drop it or raise the limit")
    default_max = max(buckets) if buckets else min(positions, DEFAULT_MAX_LENGTH)
    largest = int(max_length or default_max)
    ladder = tuple(sorted(buckets)) if buckets else bucket_ladder(largest)
    if ladder[-1] > positions:
        raise EngineError(f"largest bucket {ladder[-1]} exceeds the model's max_position_embeddings {positions}; "
                          "lower --max-length")  # fmt: skip
    return PromptLimits(positions=positions, buckets=ladder, max_length=largest, explicit_buckets=bool(buckets))
