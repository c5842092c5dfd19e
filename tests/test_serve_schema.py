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
    from bench.serve_schema import CompletionRequest

    with pytest.raises(ValidationError):
        CompletionRequest.model_validate(BASE | {field: value})


def test_integers_are_numbers_and_the_defaults_hold():
    from bench.serve_schema import CompletionRequest

    body = CompletionRequest.model_validate(BASE | {"temperature": 1, "top_p": 1, "max_tokens": 5, "seed": 0})
    assert body.temperature == 1.0 and isinstance(body.temperature, float) and isinstance(body.top_p, float)
    assert body.max_tokens == 5 and body.seed == 0 and body.stream is False and body.skip_special_tokens is True
    assert body.stream_options is None
    assert CompletionRequest.model_validate(BASE | {"stream_options": {"include_usage": True}}).stream_options.include_usage


def test_token_id_prompts_are_integers_only():
    from bench.serve_schema import CompletionRequest

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
