"""Exact-length prompts: the count (BOS and chat template included) is exact, deterministic and natural text."""

from __future__ import annotations

import pytest

from bench.errors import InputError
from bench.measure.prompts import (
    Prompt,
    default_prompt_text,
    exact_prompt,
    min_prompt_tokens,
    row_prompts,
)
from model.tokenizer import GemmaTokenizer, default_training_texts, train_tokenizer

VOCABS = (512, 8192)
SIZES = (41, 521, 2057, 3593)  # the default sweep


@pytest.fixture(scope="session")
def tokenizers_by_vocab() -> dict[int, GemmaTokenizer]:
    """One training per vocab size for the whole session."""
    texts = default_training_texts()
    return {v: GemmaTokenizer(train_tokenizer(texts, v)) for v in VOCABS}


@pytest.fixture(params=VOCABS)
def tok(request, tokenizers_by_vocab) -> GemmaTokenizer:
    return tokenizers_by_vocab[request.param]


@pytest.mark.parametrize("n", ("min", *SIZES))
def test_prompt_has_exactly_n_tokens(tok, n):
    n = min_prompt_tokens(tok) if n == "min" else n
    prompt = exact_prompt(tok, n)
    assert isinstance(prompt, Prompt)
    assert prompt.n_tokens == n == len(prompt.ids)
    assert prompt.ids == tuple(tok.chat_ids(prompt.text))  # counted after tokenization, template included
    assert prompt.ids[0] == tok.bos_id and prompt.ids[-1] == tok.encode("\n")[-1]
    assert default_prompt_text().startswith(prompt.text)  # natural text from the start of the shipped corpus


def test_every_small_n_is_exact(tok):
    first = min_prompt_tokens(tok)
    for n in range(first, first + 40):
        assert len(exact_prompt(tok, n).ids) == n


def test_long_prompt_is_exact_and_cycles_the_corpus(tokenizers_by_vocab):
    tok = tokenizers_by_vocab[8192]
    corpus = default_prompt_text()
    n = len(tok.chat_ids(corpus)) + 500  # longer than the whole corpus
    prompt = exact_prompt(tok, n)
    assert len(prompt.ids) == n
    assert prompt.text.startswith(corpus + "\n\n" + corpus[:100])


def test_prompts_for_different_n_are_prefixes_of_one_text(tok):
    texts = [exact_prompt(tok, n).text for n in (min_prompt_tokens(tok), *SIZES)]
    assert all(longer.startswith(shorter) for shorter, longer in zip(texts, texts[1:]))
    assert len(texts[1].split()) >= 5  # 41 tokens is real sentences, not padding


def test_prompts_end_on_word_boundaries_when_words_are_single_tokens(tokenizers_by_vocab):
    tok = tokenizers_by_vocab[8192]
    corpus = default_prompt_text()
    for n in SIZES:
        text = exact_prompt(tok, n).text
        assert corpus[len(text)].isspace(), (n, text[-30:])


def test_same_n_gives_the_same_prompt(tok):
    assert exact_prompt(tok, 521) == exact_prompt(tok, 521)


def test_custom_text_is_cycled_to_length(tok):
    prompt = exact_prompt(tok, 150, text="The tide comes in twice a day.")
    assert len(prompt.ids) == 150
    assert prompt.text.startswith("The tide comes in twice a day.\n\nThe tide comes in")


def test_minimum_is_template_plus_one_token(tok):
    minimum = min_prompt_tokens(tok)
    assert minimum == len(tok.chat_ids("")) + 1
    with pytest.raises(InputError) as err:
        exact_prompt(tok, minimum - 1)
    message = str(err.value)
    assert str(minimum) in message and str(minimum - 1) in message and "\n" not in message
    for bad in (0, -5):
        with pytest.raises(InputError):
            exact_prompt(tok, bad)


@pytest.mark.parametrize("bad", [True, 41.0, "41"])
def test_non_integer_n_is_an_input_error(tok, bad):
    with pytest.raises(InputError):
        exact_prompt(tok, bad)


def test_blank_text_is_an_input_error(tok):
    with pytest.raises(InputError):
        exact_prompt(tok, 100, text="  \n ")


def test_the_rows_of_a_batch_get_different_prompts_of_the_same_exact_length(tokenizers_by_vocab):
    tok = tokenizers_by_vocab[8192]
    rows = row_prompts(tok, 41, 16)
    assert len(rows) == 16 and all(p.n_tokens == len(p.ids) == 41 for p in rows)
    assert all(tuple(tok.chat_ids(p.text)) == p.ids for p in rows)
    assert len({p.ids for p in rows}) == 16  # different work
    assert rows[0] == exact_prompt(tok, 41)  # row 0 is the B = 1 cell's prompt
    assert row_prompts(tok, 41, 4) == rows[:4]  # deterministic, and a smaller batch is a prefix


@pytest.mark.parametrize("batch", [0, -2, True])
def test_a_bad_batch_of_prompts_is_an_input_error(tok, batch):
    with pytest.raises(InputError, match="whole number of rows"):
        row_prompts(tok, 41, batch)


def test_a_batch_larger_than_the_distinct_prompts_is_an_input_error(tok):
    with pytest.raises(InputError, match="different prompts of exactly"):
        row_prompts(tok, min_prompt_tokens(tok) + 1, 4, text="One. One. One. One. One.")
