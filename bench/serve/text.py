"""Text assembly for `bench serve`: generated ids to streamed text deltas, with incremental stop-string matching.

`TextAssembler` holds back an incomplete UTF-8 character and any tail that could still become a stop string;
`StopMatcher` is the Knuth-Morris-Pratt matcher behind it, so a token costs time in proportion to its characters,
not to the stop strings' lengths (at most `bench.serve.schema.MAX_STOP_LENGTH` characters each).
"""

from __future__ import annotations

from collections.abc import Sequence


class TextAssembler:
    """Turns generated ids into text deltas: holds back an incomplete UTF-8 character (at most 4 byte tokens) and
    any tail that could still become a stop string; truncates at the first stop string (which is not returned; the
    earliest-starting one when a piece completes several). The answer's text is the concatenation of these
    pieces, streamed or not: `tokenizer.decode(ids)` for valid UTF-8; a run of byte tokens that is not valid
    UTF-8 may render differently from a one-shot decode.

    Stop strings are matched incrementally (one `StopMatcher` each), so a token costs time in proportion to its
    characters, not to the stop strings' lengths (at most `MAX_STOP_LENGTH` characters each)."""

    def __init__(self, tokenizer, stops: Sequence[str], skip_special: bool):
        self.tok, self.skip = tokenizer, skip_special
        self.matchers = [StopMatcher(s) for s in dict.fromkeys(stops) if s]
        self.text, self.emitted, self.pending = "", 0, []
        self.consumed = 0  # ids taken into the answer (all of them, or up to the one completing a stop string)
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one id; returns the text now safe to send (maybe ""). After a stop string, returns "" forever."""
        if self.stopped:
            return ""
        self.consumed += 1
        self.pending.append(token_id)
        piece = self.tok.decode(self.pending, skip_special=self.skip)
        if piece.endswith("\ufffd") and len(self.pending) < 4:
            return ""
        self.pending = []
        return self._add(piece, final=False)

    def finish(self) -> str:
        """The rest of the text at the end of the generation."""
        piece = ""
        if not self.stopped and self.pending:
            piece = self.tok.decode(self.pending, skip_special=self.skip)
            self.pending = []
        return self._add(piece, final=True)

    def _add(self, piece: str, *, final: bool) -> str:
        if self.stopped:
            return ""
        start = len(self.text)
        self.text += piece
        hits = [i for i in (m.feed(piece, start) for m in self.matchers) if i is not None]
        if hits:
            self.text, self.stopped = self.text[: min(hits)], True
            end = len(self.text)
        else:
            hold = 0 if final else max((m.matched for m in self.matchers), default=0)
            end = len(self.text) - hold
        delta, self.emitted = self.text[self.emitted : max(end, self.emitted)], max(end, self.emitted)
        return delta


class StopMatcher:
    """Knuth-Morris-Pratt matching of one stop string against text that arrives in pieces: `matched` is the
    length (characters) of the longest tail of the text so far that is a proper prefix of the stop string, i.e.
    what must be held back. O(1) amortized per character; the table is O(len(stop))."""

    def __init__(self, stop: str):
        self.stop, self.matched = stop, 0
        self.fail = [0] * len(stop)  # fail[i]: longest proper border of stop[: i + 1]
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = self.fail[k - 1]
            if stop[i] == stop[k]:
                k += 1
            self.fail[i] = k

    def feed(self, piece: str, offset: int) -> int | None:
        """Take the next `piece` of text, which starts at character `offset` of the whole text. Returns where
        the first occurrence of the stop string that ends in it starts (a character index), or None."""
        stop, fail, k = self.stop, self.fail, self.matched
        for j, c in enumerate(piece):
            while k and c != stop[k]:
                k = fail[k - 1]
            if c == stop[k]:
                k += 1
            if k == len(stop):
                self.matched = 0
                return offset + j + 1 - k
        self.matched = k
        return None
