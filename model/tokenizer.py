"""A Gemma-format tokenizer: training one on the shipped text, saving it, and a typed wrapper for the engine.

Format facts (sources):
- `tokenizer.json` is a `tokenizers` BPE model with `byte_fallback=True`, unk `<unk>`, a normaliser that replaces
  " " with "▁", a `Split(" ", merged_with_previous)` pre-tokeniser, no prefix space, and a decoder
  Replace("▁", " ") -> ByteFallback -> Fuse: Hugging Face transformers 5.23 `GemmaTokenizer`
  (models/gemma/tokenization_gemma.py), summarised in `../shared/gemma4-architecture.md` §5.
  The pre-tokeniser runs after the normaliser, so it never sees a " " and leaves the text whole; BPE then runs over
  each span between added tokens.
- Special ids: pad 0, eos 1, bos 2, unk 3, mask 4, `<|turn>` 105, `<turn|>` 106 (gemma `_Gemma4SpecialTokens`,
  same §5).
  Real Gemma 4 gives some of ids 5..104 other control tokens (e.g. a tool-response token at 50); this project
  neither uses nor needs them, so a trained tokenizer reserves them as `<unused0>`..`<unused99>`.
- Chat format: `<bos><|turn>user\\n{text}<turn|>\\n<|turn>model\\n` (same §5). `tokenizer_config.json` names
  `"tokenizer_class": "GemmaTokenizer"`, padding side left (same §5).

Layout of a tokenizer trained here (ids): 0..106 the special tokens above; 107..362 the byte-fallback tokens
`<0x00>`..`<0xFF>`; then the learned pieces (the characters of the training text, "▁" always and the others by
frequency as room allows, then merges in merge order); then, if the text cannot supply enough merges, reserved
`<unused100>`, `<unused101>`, ... up to `vocab_size - 1`.

How merges are learned: BPE over words, where a word is a "▁"-led run of text (SentencePiece-style pieces never
span a space), runs of newlines are their own words, and digits are never merged (each digit is one token, as in
Gemma). Because no learned merge can join two such words, applying the merges to the whole unsplit text (what the
Gemma pre-tokeniser does) gives the same tokens as applying them word by word, so training and use agree.
The shipped text (~9,600 words) supports 5,332 learned pieces: `vocab_size=8192` therefore ends with 2,497
reserved ids, as Gemma's own vocabulary ends with reserved ids.
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Sequence
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors, trainers

from model.errors import TokenizerError

PAD, EOS, BOS, UNK, MASK = "<pad>", "<eos>", "<bos>", "<unk>", "<mask>"
TURN_START, TURN_END = "<|turn>", "<turn|>"

# Gemma 4's ids for the tokens this project uses (gemma `_Gemma4SpecialTokens`).
SPECIAL_IDS: dict[str, int] = {PAD: 0, EOS: 1, BOS: 2, UNK: 3, MASK: 4, TURN_START: 105, TURN_END: 106}

_FIRST_UNUSED_ID = 5
_NUM_SPECIAL = 107  # ids 0..106
_NUM_BYTES = 256
_FIRST_LEARNED_ID = _NUM_SPECIAL + _NUM_BYTES  # 363
# "▁" is always among the learned pieces: the decoder replaces "▁" before byte fallback (transformers' order), so a
# space spelled as the bytes of "▁" would decode as "▁", not " ".
MIN_VOCAB_SIZE = _FIRST_LEARNED_ID + 1

DEFAULT_MODEL_MAX_LENGTH = 131_072  # Gemma 4 E2B/E4B context (gemma4-architecture.md §6)

# Renders Gemma 4's turn format; "assistant" is spelled "model" as Gemma does.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['content'] is not string %}"
    "{{ raise_exception('only text message content is supported') }}"
    "{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<|turn>' + role + '\\n' + message['content'] + '<turn|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\\n' }}{% endif %}"
)


def _special_tokens() -> list[str]:
    """The 107 strings at ids 0..106, in id order."""
    names = [PAD, EOS, BOS, UNK, MASK]
    names += [f"<unused{i}>" for i in range(105 - _FIRST_UNUSED_ID)]  # ids 5..104
    names += [TURN_START, TURN_END]
    assert len(names) == _NUM_SPECIAL and all(names[i] == s for s, i in SPECIAL_IDS.items())
    return names


def _byte_tokens() -> list[str]:
    """`<0x00>`..`<0xFF>`: the spelling byte fallback looks up (tokenizers' BPE `byte_fallback`)."""
    return [f"<0x{b:02X}>" for b in range(_NUM_BYTES)]


def _training_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Words for training: newline runs alone, then "▁"-led runs, then each digit alone (see module docstring)."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n+"), behavior="isolated"),
        pre_tokenizers.Split("▁", behavior="merged_with_next"),
        pre_tokenizers.Digits(individual_digits=True),
    ])


def _learn_pieces(texts: Sequence[str], budget: int) -> tuple[list[str], list[tuple[str, str]]]:
    """BPE-trains at most `budget` pieces (alphabet + merges) on `texts`; returns (pieces in id order, merges)."""
    learner = tokenizers.Tokenizer(tokenizers.models.BPE())
    learner.normalizer = normalizers.Replace(" ", "▁")
    learner.pre_tokenizer = _training_pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=budget,
        min_frequency=0,
        limit_alphabet=budget,  # keeps the most frequent characters; the rest fall back to bytes
        initial_alphabet=["▁"],
        special_tokens=[],
        show_progress=False,
    )
    learner.train_from_iterator(list(texts), trainer)
    model = json.loads(learner.to_str())["model"]
    pieces = [p for p, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return pieces, merges


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> tokenizers.Tokenizer:
    """Trains a Gemma-format BPE tokenizer of exactly `vocab_size` ids on `texts` (layout: module docstring).

    Deterministic: the same texts and vocab_size give a byte-identical `to_str()`, in this process or a fresh one
    (tests/test_tokenizer.py checks both). Training 8192 ids on the shipped text takes about 0.1 s on 2 CPU cores.
    Raises ValueError if `vocab_size` < 364 (107 special + 256 byte tokens + "▁") or `texts` is empty.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise ValueError(f"vocab_size must be an int, got {vocab_size!r}")
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size!r} cannot hold the {_NUM_SPECIAL} special and {_NUM_BYTES} byte tokens and"
            f' "▁"; use at least {MIN_VOCAB_SIZE}'
        )
    if not texts or not any(t.strip() for t in texts):
        raise ValueError("train_tokenizer needs at least one non-empty training text")

    reserved = _special_tokens() + _byte_tokens()
    pieces, merges = _learn_pieces(texts, vocab_size - len(reserved))
    assert "▁" in pieces, pieces[:3]
    fillers = [f"<unused{i}>" for i in range(100, 100 + vocab_size - len(reserved) - len(pieces))]
    clashes = sorted(set(pieces) & set(reserved + fillers))
    if clashes:
        raise ValueError(f"the training text contains reserved token strings as words: {clashes[:5]}")
    names = reserved + pieces + fillers
    assert len(names) == vocab_size and len(set(names)) == vocab_size

    tok = tokenizers.Tokenizer(
        tokenizers.models.BPE(
            vocab={name: i for i, name in enumerate(names)},
            merges=merges,
            unk_token=UNK,
            fuse_unk=True,
            byte_fallback=True,
            dropout=None,
        )
    )
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    # Hugging Face's Gemma tokenizer.json prepends <bos> when special tokens are requested; the wrapper never asks.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1", special_tokens=[(BOS, SPECIAL_IDS[BOS])]
    )
    # Control tokens are matched whole in raw text and skipped by decode(skip_special_tokens=True).
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in _special_tokens() + fillers])
    return tok


def default_training_texts() -> list[str]:
    """The shipped natural text, `model/data/text/*.txt` in sorted name order (works from an installed package)."""
    folder = importlib.resources.files("model").joinpath("data", "text")
    if not folder.is_dir():
        raise TokenizerError(f"the training text folder {folder} is missing; the package data is incomplete")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".txt")), key=lambda f: f.name)
    if not files:
        raise TokenizerError(f"no *.txt training text found in {folder}; the package data is incomplete")
    return [f.read_text(encoding="utf-8") for f in files]


def _check_special_ids(tok: tokenizers.Tokenizer, source: str) -> None:
    """Raises TokenizerError naming `source` unless every token in SPECIAL_IDS sits at Gemma's id."""
    wrong = {name: tok.token_to_id(name) for name, i in SPECIAL_IDS.items() if tok.token_to_id(name) != i}
    if wrong:
        got = ", ".join(f"{name} at {'no id' if i is None else i}" for name, i in wrong.items())
        want = ", ".join(f"{name}={i}" for name, i in SPECIAL_IDS.items())
        raise TokenizerError(f"{source} has special tokens at non-Gemma ids ({got}); Gemma's are {want}")


def save_tokenizer_files(
    tok: tokenizers.Tokenizer | GemmaTokenizer,
    directory: str | Path,
    *,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
) -> None:
    """Writes `tokenizer.json` and `tokenizer_config.json` (Hugging Face format) into `directory` (created if absent).

    The config names `tokenizer_class: GemmaTokenizer` with the `tokenizers` backend, the special tokens, left
    padding, no added EOS, and a Jinja `chat_template` rendering Gemma 4's turn format (CHAT_TEMPLATE).
    Raises TokenizerError if the special tokens are not at Gemma's ids.
    """
    backend = tok.backend if isinstance(tok, GemmaTokenizer) else tok
    directory = Path(directory)
    _check_special_ids(backend, "the tokenizer to save")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(backend.to_str(pretty=True), encoding="utf-8")
    config = {
        "tokenizer_class": "GemmaTokenizer",
        "backend": "tokenizers",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "mask_token": MASK,
        "add_bos_token": True,
        "add_eos_token": False,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


class GemmaTokenizer:
    """A read-only wrapper over a `tokenizers.Tokenizer` whose special tokens sit at Gemma's ids.

    Works for a tokenizer trained here and for a real Gemma 4 `tokenizer.json`. `encode` never adds BOS;
    `chat_ids` builds the whole model input. Ids are Python ints in [0, vocab_size).
    """

    __slots__ = ("_tok", "_source")

    def __init__(self, backend: tokenizers.Tokenizer, *, source: str = "the tokenizer") -> None:
        """Wraps `backend`; raises TokenizerError naming `source` if its special tokens are not at Gemma's ids."""
        _check_special_ids(backend, source)
        object.__setattr__(self, "_tok", backend)
        object.__setattr__(self, "_source", source)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"GemmaTokenizer is read-only (tried to set {name!r})")

    @classmethod
    def from_dir(cls, path: str | Path) -> GemmaTokenizer:
        """Loads `<path>/tokenizer.json`.

        Raises TokenizerError (one line naming the path) if the folder or file is missing, the file is not a
        tokenizers JSON, or its special tokens are not at Gemma's ids.
        """
        file = Path(path) / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(f"no tokenizer.json in {path}; point to a folder holding a Gemma tokenizer.json")
        try:
            text = file.read_text(encoding="utf-8")
            json.loads(text)
            backend = tokenizers.Tokenizer.from_str(text)
        except Exception as e:  # OSError, UnicodeDecodeError, JSONDecodeError, or the plain Exception of tokenizers
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TokenizerError(f"{file} is not a valid tokenizers JSON file ({reason})") from e
        return cls(backend, source=str(file))

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The wrapped `tokenizers.Tokenizer` (do not mutate it)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the embedding table needs at least this many rows)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return SPECIAL_IDS[PAD]

    @property
    def eos_id(self) -> int:
        return SPECIAL_IDS[EOS]

    @property
    def bos_id(self) -> int:
        return SPECIAL_IDS[BOS]

    @property
    def turn_start_id(self) -> int:
        """`<|turn>`, which opens a chat turn."""
        return SPECIAL_IDS[TURN_START]

    @property
    def turn_end_id(self) -> int:
        """`<turn|>`, which closes a chat turn."""
        return SPECIAL_IDS[TURN_END]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS. Control-token strings in `text` (e.g. "<turn|>") become their ids.
        Raises TypeError for a non-str, TokenizerError for text that is not valid Unicode (a lone surrogate)."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TokenizerError(f"text is not valid Unicode ({exc.reason} at character {exc.start})") from None
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of `ids`; special and reserved tokens are dropped unless `skip_special=False`."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def chat_ids(self, user_text: str) -> list[int]:
        """Model input for one user message: BOS + `<|turn>user\\n{user_text}<turn|>\\n<|turn>model\\n`.

        Equals rendering CHAT_TEMPLATE with add_generation_prompt=True and encoding it without added specials,
        which is what Hugging Face `apply_chat_template(..., tokenize=True)` does.
        """
        return [self.bos_id] + self.encode(f"{TURN_START}user\n{user_text}{TURN_END}\n{TURN_START}model\n")

    def __repr__(self) -> str:
        return f"GemmaTokenizer(vocab_size={self.vocab_size}, source={self._source!r})"
