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
  These are the ids of a tokenizer trained here; a loaded checkpoint's are read from its own files
  (`read_special_tokens`: tokenizer_config.json's token names, config.json's ids, the turn markers by their strings),
  so a checkpoint with another layout works; only what is missing is refused (no BOS; no turn markers, for chat).
- Text versus control tokens: `encode(text)` parses control-token strings (raw input); `encode(text, special=False)`
  and the chat builders never produce a control id from text (tokenizers' `encode_special_tokens` switch, plus a
  byte-token spelling for a control token the merges could rebuild).
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

import dataclasses
import importlib.resources
import json
import re
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


def _require_tokens(tok: tokenizers.Tokenizer, names: Sequence[str], source: str) -> None:
    """Raises TokenizerError naming `source` and the tokens it lacks unless it holds every one of `names`."""
    missing = [name for name in names if tok.token_to_id(name) is None]
    if missing:
        raise TokenizerError(f"{source} has no {', '.join(missing)} token; a Gemma tokenizer needs them")


def save_tokenizer_files(
    tok: tokenizers.Tokenizer | GemmaTokenizer,
    directory: str | Path,
    *,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
) -> None:
    """Writes `tokenizer.json` and `tokenizer_config.json` (Hugging Face format) into `directory` (created if absent).

    The config names `tokenizer_class: GemmaTokenizer` with the `tokenizers` backend, the special tokens, left
    padding, no added EOS, and a Jinja `chat_template` rendering Gemma 4's turn format (CHAT_TEMPLATE).
    Raises TokenizerError if the tokenizer lacks one of the tokens the config names (bos, eos, pad, unk, mask); their
    ids are the tokenizer's own (a trained one has Gemma's, SPECIAL_IDS).
    """
    backend = tok.backend if isinstance(tok, GemmaTokenizer) else tok
    directory = Path(directory)
    _require_tokens(backend, [BOS, EOS, PAD, UNK, MASK], "the tokenizer to save")
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecialTokens:
    """The ids (in [0, vocab_size)) of the control tokens this project uses, as one checkpoint's tokenizer has them.

    bos: prepended to every prompt (required). eos, pad: None when the tokenizer has none (the engine takes its own
    from config.json). turn_start / turn_end: `<|turn>` / `<turn|>`, None when absent (then the chat format is
    unavailable and `chat_turn_ids` says so)."""

    bos: int
    eos: int | None = None
    pad: int | None = None
    turn_start: int | None = None
    turn_end: int | None = None


def read_special_tokens(backend: tokenizers.Tokenizer, *, tokenizer_config: dict | None = None,
                        model_config: dict | None = None, source: str = "the tokenizer") -> SpecialTokens:  # fmt: skip
    """The special ids of `backend`, read as transformers reads them: bos/eos/pad by the token strings
    `tokenizer_config` (tokenizer_config.json) names, else by the ids `model_config` (config.json, or its
    `text_config`) gives, else by Gemma's strings (<bos>, <eos>, <pad>); the turn markers by their strings.
    Raises TokenizerError naming `source` when there is no BOS, or a named token or id is not in the vocabulary."""
    size = backend.get_vocab_size(with_added_tokens=True)
    tcfg, mcfg = tokenizer_config or {}, model_config or {}
    mcfg = {**(mcfg.get("text_config") or {}), **{k: v for k, v in mcfg.items() if v is not None}}

    def resolve(role: str, default: str) -> int | None:
        named = tcfg.get(f"{role}_token")
        named = named.get("content") if isinstance(named, dict) else named
        if isinstance(named, str):
            if (i := backend.token_to_id(named)) is None:
                raise TokenizerError(f"{source}: tokenizer_config.json names {role}_token {named!r}, which the "
                                     "vocabulary does not hold")  # fmt: skip
            return i
        given = mcfg.get(f"{role}_token_id")
        given = given[0] if isinstance(given, list) and given else given
        if isinstance(given, int) and not isinstance(given, bool):
            if not 0 <= given < size:
                raise TokenizerError(f"{source}: config.json's {role}_token_id {given} is outside the vocabulary "
                                     f"[0, {size})")  # fmt: skip
            return given
        return backend.token_to_id(default)

    bos = resolve("bos", BOS)
    if bos is None:
        raise TokenizerError(f"{source} has no BOS token: no bos_token in tokenizer_config.json, no bos_token_id in "
                             f"config.json and no {BOS} in the vocabulary")  # fmt: skip
    return SpecialTokens(bos=bos, eos=resolve("eos", EOS), pad=resolve("pad", PAD),
                         turn_start=backend.token_to_id(TURN_START), turn_end=backend.token_to_id(TURN_END))  # fmt: skip


_BYTE_TOKEN = re.compile(r"<0x([0-9A-F]{2})>")


def _chars_per_token(spec: dict, vocab: dict[str, int]) -> int | None:
    """The most characters of input text one token can stand for, or None when this tokenizer's pipeline gives no
    such bound. Sound for a BPE model whose normaliser replaces characters one for one (or is absent), whose
    pre-tokeniser drops nothing, and whose added tokens strip no whitespace, where an unknown character falls back to
    byte tokens (or there is no unk): then every token is a piece of the normalised text, a byte token (at most one
    character) or an added token's content, so a text of C characters has at least C / bound tokens."""
    model, added = spec.get("model") or {}, spec.get("added_tokens") or []
    if model.get("type") != "BPE" or any(t.get("lstrip") or t.get("rstrip") for t in added):
        return None
    if model.get("unk_token") is not None and not (model.get("byte_fallback") and
                                                   all(f"<0x{b:02X}>" in vocab for b in range(256))):  # fmt: skip
        return None

    def one_for_one(n: dict | None) -> bool:
        if n is None:
            return True
        if n.get("type") == "Sequence":
            return all(one_for_one(x) for x in n.get("normalizers", []))
        pattern = (n.get("pattern") or {}).get("String")
        content = n.get("content", "")
        return n.get("type") == "Replace" and isinstance(pattern, str) and len(pattern) == len(content) == 1

    def keeps_all(p: dict | None) -> bool:
        if p is None:
            return True
        if p.get("type") == "Sequence":
            return all(keeps_all(x) for x in p.get("pretokenizers", []))
        return p.get("type") == "Digits" or (p.get("type") == "Split" and p.get("behavior") != "Removed")

    if not (one_for_one(spec.get("normalizer")) and keeps_all(spec.get("pre_tokenizer"))):
        return None
    return max((1 if _BYTE_TOKEN.fullmatch(t) else len(t) for t in vocab), default=1)


class GemmaTokenizer:
    """A read-only wrapper over a `tokenizers.Tokenizer` in Gemma's format, with that checkpoint's special ids.

    Works for a tokenizer trained here (Gemma's ids, SPECIAL_IDS), a real Gemma 4 `tokenizer.json`, and a checkpoint
    with its own layout (special ids read from its files, `read_special_tokens`). `encode` never adds BOS; `chat_ids`
    and `chat_turn_ids` build the whole model input, with message text always encoded as text (a control-token string
    in it never becomes a control id). Ids are Python ints in [0, vocab_size).
    """

    __slots__ = ("_tok", "_text_tok", "_source", "_special", "_control", "_bytes", "_chars_per_token")

    def __init__(self, backend: tokenizers.Tokenizer, *, source: str = "the tokenizer",
                 special: SpecialTokens | None = None, spec: dict | None = None) -> None:  # fmt: skip
        """Wraps `backend`. `special`: its special ids (default: `read_special_tokens(backend)`, by Gemma's token
        strings); `spec`: its parsed tokenizer.json (default: parsed from `backend`). Raises TokenizerError naming
        `source` when it has no BOS."""
        serialized = backend.to_str()  # once: the text-only copy below, and the pipeline's description
        spec = spec if spec is not None else json.loads(serialized)
        special = special or read_special_tokens(backend, source=source)
        text_tok = tokenizers.Tokenizer.from_str(serialized)
        text_tok.encode_special_tokens = True  # the library's own switch: special tokens' strings are split as text
        control = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        control |= {i for i in dataclasses.astuple(special) if i is not None}
        vocab = backend.get_vocab(with_added_tokens=True)
        byte_ids = [vocab.get(f"<0x{b:02X}>") for b in range(256)]
        for name, value in (("_tok", backend), ("_text_tok", text_tok), ("_source", source), ("_special", special),
                            ("_control", frozenset(control)), ("_bytes", None if None in byte_ids else byte_ids),
                            ("_chars_per_token", _chars_per_token(spec, vocab))):  # fmt: skip
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"GemmaTokenizer is read-only (tried to set {name!r})")

    @classmethod
    def from_dir(cls, path: str | Path) -> GemmaTokenizer:
        """Loads `<path>/tokenizer.json`, with the special ids of `<path>`'s tokenizer_config.json and config.json
        where present (`read_special_tokens`).

        Raises TokenizerError (one line naming the path) if the folder or file is missing, a file is not valid
        JSON (tokenizer.json: not a tokenizers JSON), or the special tokens are missing (no BOS) or out of range.
        """
        file = Path(path) / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(f"no tokenizer.json in {path}; point to a folder holding a Gemma tokenizer.json")
        try:
            text = file.read_text(encoding="utf-8")
            spec = json.loads(text)
            backend = tokenizers.Tokenizer.from_str(text)
        except Exception as e:  # OSError, UnicodeDecodeError, JSONDecodeError, or the plain Exception of tokenizers
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TokenizerError(f"{file} is not a valid tokenizers JSON file ({reason})") from e
        configs = [_read_optional_json(Path(path) / name) for name in ("tokenizer_config.json", "config.json")]
        special = read_special_tokens(backend, tokenizer_config=configs[0], model_config=configs[1], source=str(file))
        return cls(backend, source=str(file), special=special, spec=spec)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The wrapped `tokenizers.Tokenizer` (do not mutate it)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the embedding table needs at least this many rows)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def special(self) -> SpecialTokens:
        """This tokenizer's special ids."""
        return self._special

    @property
    def pad_id(self) -> int | None:
        return self._special.pad

    @property
    def eos_id(self) -> int | None:
        return self._special.eos

    @property
    def bos_id(self) -> int:
        return self._special.bos

    @property
    def turn_start_id(self) -> int | None:
        """`<|turn>`, which opens a chat turn (None: this tokenizer has no chat format)."""
        return self._special.turn_start

    @property
    def turn_end_id(self) -> int | None:
        """`<turn|>`, which closes a chat turn (None: this tokenizer has no chat format)."""
        return self._special.turn_end

    @property
    def max_chars_per_token(self) -> int | None:
        """The most characters of text one token can stand for (so a text of C characters has at least
        ceil(C / this) tokens, a bound that needs no tokenizing), or None where this tokenizer gives no such bound."""
        return self._chars_per_token

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of `text`, without BOS. special=True: control-token strings in `text` (e.g. "<turn|>") become
        their ids (raw input, as `bench generate --raw` and a completions prompt want). special=False: `text` is
        only text: no control id is ever returned (the library's `encode_special_tokens` splits their strings, and
        a control id its merges still rebuild is spelled in byte tokens). Raises TypeError for a non-str,
        TokenizerError for text that is not valid Unicode (a lone surrogate), or, with special=False, for a
        control id the tokenizer rebuilds that it has no byte tokens to spell."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TokenizerError(f"text is not valid Unicode ({exc.reason} at character {exc.start})") from None
        if special:
            return self._tok.encode(text, add_special_tokens=False).ids
        ids = self._text_tok.encode(text, add_special_tokens=False).ids
        if self._control.isdisjoint(ids):
            return ids
        return [j for i in ids for j in (self._spelled(i) if i in self._control else (i,))]

    def _spelled(self, token_id: int) -> list[int]:
        """The byte-token ids of a control token's string (the same text, never a control id)."""
        if self._bytes is None:
            raise TokenizerError(f"{self._source} encodes text as control token {token_id} and has no byte tokens "
                                 "to spell it as text")  # fmt: skip
        return [self._bytes[b] for b in self._tok.id_to_token(token_id).encode("utf-8")]

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of `ids`; special and reserved tokens are dropped unless `skip_special=False`."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def chat_turn_ids(self, turns: Sequence[tuple[str, str]], *, add_generation_prompt: bool = True) -> list[int]:
        """Model input for a conversation of (role, text) turns, roles as Gemma spells them ("user", "system",
        "model"): BOS + `<|turn>{role}\\n{text}<turn|>\\n` per turn (+ `<|turn>model\\n`). Role and text are encoded
        as text (`encode(..., special=False)`): only the format's own markers are control ids. Raises
        TokenizerError naming the missing marker when the tokenizer has no `<|turn>` or `<turn|>`."""
        start, end = self.turn_start_id, self.turn_end_id
        if start is None or end is None:
            missing = " and ".join(n for n, i in ((TURN_START, start), (TURN_END, end)) if i is None)
            raise TokenizerError(f"{self._source} has no {missing} token, so Gemma's chat format is unavailable; "
                                 "send the prompt as raw text instead")  # fmt: skip
        ids = [self.bos_id]
        for role, text in turns:
            ids += [start, *self.encode(f"{role}\n{text}", special=False), end, *self.encode("\n", special=False)]
        return ids + ([start, *self.encode("model\n", special=False)] if add_generation_prompt else [])

    def chat_ids(self, user_text: str) -> list[int]:
        """Model input for one user message: BOS + `<|turn>user\\n{user_text}<turn|>\\n<|turn>model\\n`, the text
        encoded as text (`chat_turn_ids`). For text without control-token strings this equals rendering
        CHAT_TEMPLATE with add_generation_prompt=True and encoding it without added specials, which is what Hugging
        Face `apply_chat_template(..., tokenize=True)` does."""
        return self.chat_turn_ids([("user", user_text)])

    def __repr__(self) -> str:
        return f"GemmaTokenizer(vocab_size={self.vocab_size}, source={self._source!r})"


def _read_optional_json(file: Path) -> dict | None:
    """The JSON object in `file`, or None when there is no such file. Raises TokenizerError naming it when it is
    not a JSON object."""
    if not file.is_file():
        return None
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{file} is not valid JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    if not isinstance(value, dict):
        raise TokenizerError(f"{file} must hold a JSON object, got {type(value).__name__}")
    return value
