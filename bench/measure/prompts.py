"""Benchmark prompts of natural text whose token count, BOS and chat template included, is exact.

"Input tokens" (`docs/method.md`): the exact number of ids fed to the model for one request, BOS and chat
template included; `--inputs 41` means 41 ids, checked after tokenization.

How a prompt of n tokens is found: the user message is a prefix of one fixed source text (by default the shipped
corpus, `model/data/text/*.txt` joined by blank lines, repeated as often as needed). A binary search picks the
longest prefix ending on a word boundary whose chat prompt has at most n tokens; if that is short of n, the prefix
grows one character at a time into the next word until the count is exactly n (a prefix ending in a space only
when no other one fits: a digit after a space costs two tokens, "▁" and the digit). BPE can merge across the cut, so
every candidate is counted by tokenizing the whole chat prompt; nothing is estimated. Prompts for different n are
therefore prefixes of the same text: a 41-token prompt is the first sentences of the corpus, not padding.
Cost: about 15-40 tokenizations of at most the prompt's text (~20 ms each for 8,000 tokens at vocab 8192).
"""

from __future__ import annotations

import bisect
import dataclasses
import re

from bench.errors import InputError
from model.tokenizer import GemmaTokenizer, default_training_texts

_CHUNK_SEPARATOR = "\n\n"


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: `ids == tuple(tokenizer.chat_ids(text))` and `len(ids) == n_tokens`."""

    text: str  # the user message (natural text) placed in the chat template
    ids: tuple[int, ...]  # BOS + `<|turn>user\n{text}<turn|>\n<|turn>model\n`, tokenized
    n_tokens: int


def min_prompt_tokens(tokenizer: GemmaTokenizer) -> int:
    """The smallest exact prompt: BOS + chat template + one content token."""
    return len(tokenizer.chat_ids("")) + 1


def default_prompt_text() -> str:
    """The shipped natural text, one source for every prompt: the corpus files joined by blank lines."""
    return _CHUNK_SEPARATOR.join(t.strip() for t in default_training_texts())


def exact_prompt(tokenizer: GemmaTokenizer, n_tokens: int, *, text: str | None = None) -> Prompt:
    """A chat prompt whose natural-text message makes it exactly `n_tokens` ids long (BOS and template included).

    `text` is the source whose prefixes are tried (default: `default_prompt_text()`); it is repeated, joined by
    blank lines, when it is too short. Deterministic: the same tokenizer, n_tokens and text give the same prompt.
    Raises InputError if `n_tokens` is not an int or is below `min_prompt_tokens(tokenizer)`, or if `text` is blank.
    """
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int):
        raise InputError(f"input tokens must be an integer, got {n_tokens!r}")
    minimum = min_prompt_tokens(tokenizer)
    if n_tokens < minimum:
        raise InputError(
            f"input tokens {n_tokens} is below the smallest possible prompt, {minimum} tokens"
            f" (BOS + chat template + 1 content token); use {minimum} or more"
        )
    source = default_prompt_text() if text is None else text
    if not source.strip():
        raise InputError("the prompt source text is empty; pass natural text to build prompts from")

    def count(content: str) -> int:
        return len(tokenizer.chat_ids(content))

    source = _long_enough(source.strip(), n_tokens, count)
    # Word ends: prefix lengths k where source[:k] ends a word (the next character is whitespace or the end).
    word_ends = [k for k in range(1, len(source) + 1) if not source[k - 1].isspace()
                 and (k == len(source) or source[k].isspace())]

    # Largest word end whose prompt fits in n_tokens (counts grow with the prefix, up to rare BPE wobbles that the
    # character scan below absorbs).
    lo, hi = 0, len(word_ends)  # invariant: word_ends[:lo] fit (as far as probed), word_ends[hi:] do not
    while lo < hi:
        mid = (lo + hi) // 2
        if count(source[: word_ends[mid]]) <= n_tokens:
            lo = mid + 1
        else:
            hi = mid
    start = word_ends[lo - 1] if lo > 0 else 0

    found = _scan(source, start, n_tokens, count, word_ends)
    if found is None:  # a BPE wobble skipped n at every cut after `start`: look back a few words
        back = word_ends[max(0, lo - 1 - 8)] if lo > 0 else 0
        found = _scan(source, back, n_tokens, count, word_ends)
    if found is None:
        raise RuntimeError(f"no prefix of the prompt text tokenizes to exactly {n_tokens} tokens")
    ids = tuple(tokenizer.chat_ids(found))
    assert len(ids) == n_tokens, (len(ids), n_tokens)
    return Prompt(text=found, ids=ids, n_tokens=n_tokens)


def row_prompts(tokenizer: GemmaTokenizer, n_tokens: int, batch: int, *, text: str | None = None) -> list[Prompt]:
    """`batch` different prompts of exactly `n_tokens` ids each, for the rows of a batch (docs/method.md,
    "Batches": the rows do equal work, on different text). Row 0 is `exact_prompt(tokenizer, n_tokens, text=text)`,
    the B = 1 cell's prompt; row r is the exact prompt of the source rotated to start at its r-th sentence (the
    text from there on, then the text before it), skipping a start whose prompt equals an earlier row's.
    Deterministic. Raises InputError as `exact_prompt`, for a batch below 1, or when the source has fewer
    sentence starts giving distinct prompts than `batch` (at tiny sizes few words fit)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InputError(f"batch {batch!r}: expected a whole number of rows >= 1")
    source = (default_prompt_text() if text is None else text).strip()
    if not source:
        raise InputError("the prompt source text is empty; pass natural text to build prompts from")
    starts = [0] + [m.end() for m in re.finditer(r"(?<=[.!?])\s+", source)]
    prompts: list[Prompt] = []
    seen: set[tuple[int, ...]] = set()
    for start in starts:
        if len(prompts) == batch:
            break
        rotated = source[start:] + _CHUNK_SEPARATOR + source[:start] if start else source
        p = exact_prompt(tokenizer, n_tokens, text=rotated)
        if p.ids not in seen:
            seen.add(p.ids)
            prompts.append(p)
    if len(prompts) < batch:
        raise InputError(f"--batch {batch} at {n_tokens} input tokens: the prompt text gives only {len(prompts)} "
                         f"different prompts of exactly {n_tokens} tokens; use more input tokens or a smaller batch")
    return prompts


def _long_enough(source: str, n_tokens: int, count) -> str:
    """`source` repeated (joined by blank lines) until its whole chat prompt exceeds `n_tokens` by a margin."""
    repeated = source
    while count(repeated) <= n_tokens + 16:
        repeated = repeated + _CHUNK_SEPARATOR + source
    return repeated


def _scan(source: str, start: int, n_tokens: int, count, word_ends: list[int]) -> str | None:
    """First prefix of at least `start` (and 1) characters whose prompt has exactly n_tokens ids, or None.

    Prefers a prefix that does not end in whitespace; one that does (e.g. "is about " before a lone "▁" token
    and a digit) is the fallback. Stops two word ends past the first prefix that overshoots n_tokens (one more
    character adds at most a token or two, so n cannot be reached later except through a BPE wobble).
    """
    fallback = None
    overshoot_stop = None
    for k in range(max(start, 1), len(source) + 1):
        c = count(source[:k])
        if c == n_tokens:
            if not source[k - 1].isspace():
                return source[:k]
            if fallback is None:
                fallback = source[:k]
        if c > n_tokens and overshoot_stop is None:
            i = bisect.bisect_left(word_ends, k)
            overshoot_stop = word_ends[min(i + 2, len(word_ends) - 1)]
        if overshoot_stop is not None and k >= overshoot_stop:
            break
    return fallback
