"""`bench serve`'s request schema without a model: JSON types are checked strictly (a string is not a number, a
number is not a boolean; an integer is a number), and a wrong type is a 400 in OpenAI's error body naming the field,
the type received and the type expected.

The HTTP tests post to an app whose model never loads (no lifespan runs under a plain `TestClient`): a body that
passes validation gets 503 "loading", one that fails it gets 400 before the handler runs.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

BASE = {"model": "tiny", "prompt": "x"}


@pytest.fixture(scope="module")
def client():
    from fastapi.testclient import TestClient

    from bench.serve import create_app

    def never_loads():
        raise AssertionError("the loader must not run without a lifespan")

    return TestClient(create_app(never_loads, model_name="tiny"))


def _error(r) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    return err


# ---- the models -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", "5"), ("max_tokens", 5.0), ("max_tokens", True), ("temperature", "0.5"), ("temperature", True),
     ("top_p", "1"), ("top_k", "1"), ("seed", "7"), ("n", "1"), ("stream", "true"), ("stream", 1),
     ("ignore_eos", "false"), ("skip_special_tokens", 0), ("stream_options", {"include_usage": "yes"})],
)  # fmt: skip
def test_a_wrong_json_type_is_refused_not_coerced(field, value):
    from bench.serve.schema import CompletionRequest

    with pytest.raises(ValidationError):
        CompletionRequest.model_validate(BASE | {field: value})


def test_integers_are_numbers_and_the_defaults_hold():
    from bench.serve.schema import CompletionRequest

    body = CompletionRequest.model_validate(BASE | {"temperature": 1, "top_p": 1, "max_tokens": 5, "seed": 0})
    assert body.temperature == 1.0 and isinstance(body.temperature, float) and isinstance(body.top_p, float)
    assert body.max_tokens == 5 and body.seed == 0 and body.stream is False and body.skip_special_tokens is True
    assert body.stream_options is None
    assert CompletionRequest.model_validate(BASE | {"stream_options": {"include_usage": True}}).stream_options.include_usage


def test_token_id_prompts_are_integers_only():
    from bench.serve.schema import CompletionRequest

    assert CompletionRequest.model_validate(BASE | {"prompt": [2, 444]}).prompt == [2, 444]
    for prompt in ([2, True], [2, 4.0], 5):
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate(BASE | {"prompt": prompt})


# ---- over HTTP ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "expected", "received"),
    [
        ("max_tokens", "5", "must be an integer", 'got a string: "5"'),
        ("max_tokens", 5.5, "must be an integer", "got a number: 5.5"),
        ("temperature", "0.7", "must be a number", 'got a string: "0.7"'),
        ("temperature", True, "must be a number", "got a boolean: true"),
        ("top_p", [1], "must be a number", "got an array: [1]"),
        ("top_k", "40", "must be an integer", 'got a string: "40"'),
        ("seed", "7", "must be an integer", 'got a string: "7"'),
        ("n", "1", "must be an integer", 'got a string: "1"'),
        ("stream", "true", "must be a boolean (true or false)", 'got a string: "true"'),
        ("stream", 1, "must be a boolean (true or false)", "got an integer: 1"),
        ("ignore_eos", "yes", "must be a boolean (true or false)", 'got a string: "yes"'),
        ("skip_special_tokens", None, "must be a boolean (true or false)", "got null"),
        ("stop", [1], "must be a string or an array of strings", "got an array: [1]"),
        ("model", 5, "must be a string", "got an integer: 5"),
        ("prompt", 5, "must be a string, an array of strings or an array of integers", "got an integer: 5"),
    ],
)
def test_a_wrong_type_is_a_400_naming_field_received_and_expected(client, field, value, expected, received):
    err = _error(client.post("/v1/completions", json=BASE | {field: value}))
    assert err["param"] == field and err["code"] == "invalid_value"
    assert err["message"] == f"{field} {expected}, {received}"


def test_nested_fields_are_named_by_their_path(client):
    err = _error(client.post("/v1/completions", json=BASE | {"stream_options": {"include_usage": "true"}}))
    assert err["param"] == "stream_options.include_usage" and "boolean" in err["message"]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": 7}]}
    err = _error(client.post("/v1/chat/completions", json=chat))
    assert err["param"] == "messages.1.content"
    assert err["message"] == "messages.1.content must be a string or an array of objects, got an integer: 7"
    err = _error(client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"content": "hi"}]}))
    assert err["param"] == "messages.0.role" and err["message"] == "messages.0.role is required: expected a string"


def test_a_body_that_is_not_an_object_or_not_json(client):
    err = _error(client.post("/v1/completions", json=[1, 2]))
    assert err["param"] is None and err["message"] == "the request body must be a JSON object, got an array: [1, 2]"
    err = _error(client.post("/v1/completions", content=b"{oops", headers={"content-type": "application/json"}))
    assert err["param"] is None and err["code"] == "invalid_json"
    err = _error(client.post("/v1/completions", json={"model": "tiny"}))
    assert err["param"] == "prompt" and err["message"].startswith("prompt is required: expected a string")


def test_long_values_are_cut_in_the_message(client):
    err = _error(client.post("/v1/completions", json=BASE | {"max_tokens": "9" * 500}))
    assert err["param"] == "max_tokens" and len(err["message"]) < 100 and err["message"].endswith("...")


@pytest.mark.parametrize("extra", [{"temperature": 1, "top_p": 1}, {"temperature": 0, "max_tokens": 4, "seed": 3},
                                   {"stream": False, "ignore_eos": True, "stream_options": {"include_usage": False}},
                                   {"unknown_openai_field": "ignored"}])  # fmt: skip
def test_well_typed_bodies_pass_validation(client, extra):
    r = client.post("/v1/completions", json=BASE | extra)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading", r.text  # past validation


# ---- ranges, unsupported fields, stop strings (sampling_params, with a stand-in engine) ------------------------------
class _Engine:
    """What `sampling_params` reads of an engine: the length limit (tokens) and the vocabulary size."""

    max_length = 256
    cfg = type("Cfg", (), {"vocab_size": 512})()


def _params(kind="completion", **fields):
    from bench.serve.schema import ChatRequest, CompletionRequest, sampling_params

    if kind == "chat":
        body = ChatRequest.model_validate({"model": "tiny", "messages": [{"role": "user", "content": "x"}]} | fields)
    else:
        body = CompletionRequest.model_validate(BASE | fields)
    return sampling_params(body, kind, _Engine())


def _refused(param, **fields):
    from bench.serve.schema import APIError

    with pytest.raises(APIError) as info:
        _params(**fields)
    assert info.value.status == 400 and info.value.param == param, info.value.message
    return info.value.message


@pytest.mark.parametrize(("top_k", "expected"), [(2**31, 512), (2**63 + 5, 512), (513, 512), (512, 512), (40, 40),
                                                  (0, 0), (-1, 0)])  # fmt: skip
def test_top_k_above_the_vocabulary_is_clamped_and_minus_one_is_off(top_k, expected):
    sampling, _ = _params(top_k=top_k, temperature=0.7)
    assert sampling.top_k == expected
    sampling.args()  # every value fits the engine's int32 / uint32 arguments


def test_top_k_below_minus_one_is_refused():
    assert "top_k" in _refused("top_k", top_k=-2)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**100])
def test_a_seed_outside_64_bits_is_a_400_naming_the_range(seed):
    message = _refused("seed", seed=seed)
    assert "seed" in message and "2^63" in message and "2^64" in message


@pytest.mark.parametrize("seed", [-(2**63), -1, 0, 2**32, 2**64 - 1])
def test_64_bit_seeds_are_taken_modulo_2_to_the_32(seed):
    sampling, _ = _params(seed=seed)
    assert sampling.seed == seed % 2**32
    sampling.args()


def test_max_completion_tokens_is_max_tokens():
    assert _params("chat", max_completion_tokens=16)[1] == 16
    assert _params("completion", max_completion_tokens=7)[1] == 7
    assert _params("chat", max_completion_tokens=9, max_tokens=9)[1] == 9
    message = _refused("max_completion_tokens", max_tokens=5, max_completion_tokens=7)
    assert "max_tokens" in message and "max_completion_tokens" in message
    assert "max_completion_tokens" in _refused("max_completion_tokens", max_completion_tokens=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("response_format", {"type": "json_object"}), ("echo", True), ("best_of", 2), ("suffix", "end"),
     ("logit_bias", {"50": 10}), ("frequency_penalty", 0.5), ("presence_penalty", -1),
     ("tools", [{"type": "function"}]),
     ("tool_choice", "required"), ("tool_choice", {"type": "function"}), ("logprobs", True), ("logprobs", 2),
     ("top_logprobs", 3), ("repetition_penalty", 1.1), ("min_p", 0.1), ("min_tokens", 4), ("functions", [{}]),
     ("function_call", {"name": "f"})],
)  # fmt: skip
def test_fields_that_would_change_the_output_are_refused_not_ignored(field, value):
    message = _refused(field, **{field: value})
    assert message.startswith(f"this server does not support {field}")


@pytest.mark.parametrize(
    "neutral",
    [{"response_format": {"type": "text"}}, {"response_format": None}, {"echo": False}, {"best_of": 1}, {"suffix": ""},
     {"suffix": None}, {"logit_bias": {}}, {"logit_bias": None}, {"frequency_penalty": 0}, {"presence_penalty": 0.0},
     {"tools": []}, {"tools": None}, {"tool_choice": "none"}, {"tool_choice": "auto"}, {"tool_choice": None},
     {"logprobs": False}, {"logprobs": 0}, {"logprobs": None}, {"top_logprobs": 0}, {"repetition_penalty": 1},
     {"min_p": 0}, {"min_tokens": 0}, {"functions": []}, {"function_call": "none"}],
)  # fmt: skip
def test_the_neutral_values_clients_send_are_accepted(neutral):
    for kind in ("completion", "chat"):
        _params(kind, **neutral)


def test_stop_strings_are_limited_in_number_and_length():
    from bench.serve.schema import MAX_STOP_LENGTH, MAX_STOP_STRINGS

    assert MAX_STOP_LENGTH == 1000
    _params(stop=["a" * MAX_STOP_LENGTH] * MAX_STOP_STRINGS)
    message = _refused("stop", stop=["ok", "b" * (MAX_STOP_LENGTH + 1)])
    assert str(MAX_STOP_LENGTH) in message and str(MAX_STOP_LENGTH + 1) in message
    assert "stop" in _refused("stop", stop="c" * 60_000)
    assert "stop" in _refused("stop", stop=["d"] * (MAX_STOP_STRINGS + 1))


def test_the_context_error_names_the_field_to_change():
    from bench.serve.schema import APIError, check_context

    class Eng(_Engine):
        buckets = (32, 64, 128, 256)
        cfg = type("Cfg", (), {"vocab_size": 512, "max_position_embeddings": 256})()

    check_context(100, 156, Eng(), prompt_param="prompt", max_tokens_param="max_tokens")  # exactly fits
    with pytest.raises(APIError) as info:  # lowering max_tokens fits
        check_context(122, 250, Eng(), prompt_param="prompt", max_tokens_param="max_completion_tokens")
    err = info.value
    assert err.param == "max_completion_tokens" and err.code == "context_length_exceeded"
    assert "134" in err.message and "--" not in err.message
    for n in (256, 300):  # the prompt alone leaves no room / is above the largest bucket
        with pytest.raises(APIError) as info:
            check_context(n, 1, Eng(), prompt_param="messages", max_tokens_param="max_tokens")
        assert info.value.param == "messages" and "256" in info.value.message and "--" not in info.value.message


# ---- every error is an OpenAI error body, and counted ----------------------------------------------------------------
def _errors_counted(client) -> float:
    from bench.sweep.remote import parse_metrics

    return sum(v for k, v in parse_metrics(client.get("/metrics").text).items() if k.startswith("gemma4_bench_errors"))


def _openai_error(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_unknown_routes_and_wrong_methods_get_openai_errors_and_are_counted(client):
    before = _errors_counted(client)
    err = _openai_error(client.get("/v1/nope"), 404)
    assert "/v1/nope" in err["message"] and err["type"] == "invalid_request_error"
    err = _openai_error(client.get("/v1/completions"), 405)
    assert "GET" in err["message"] and "POST" in err["message"]
    assert _errors_counted(client) == before + 2
    requests = [k for k in client.get("/metrics").text.splitlines() if k.startswith("gemma4_bench_requests_total")]
    assert any('path="unmatched"' in k and 'code="404"' in k for k in requests)  # not one label per probed URL
    assert not any("/v1/nope" in k for k in requests)


@pytest.mark.parametrize(
    ("raw", "words"),
    [('{"model": "tiny", "prompt": "x", "seed": ' + "9" * 5000 + "}", "digits"),
     ('{"model": "tiny", "prompt": "x", "extra": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested"),
     ('{"model": "tiny", "prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested")],
)  # fmt: skip
def test_json_too_deep_or_with_huge_integers_is_a_400_invalid_json(client, raw, words):
    before = _errors_counted(client)
    err = _openai_error(client.post("/v1/completions", content=raw, headers={"content-type": "application/json"}), 400)
    assert err["code"] == "invalid_json" and words in err["message"] and len(err["message"]) < 200
    assert _errors_counted(client) == before + 1
