"""Hostile input: whatever a client sends, the answer is a 4xx in OpenAI's error shape — never a
500, never FastAPI's 422, never a stack trace — and the server is still healthy afterwards."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from billing import keys

HELLO = [{"role": "user", "content": "hello"}]
VALID = {"model": "demo", "messages": HELLO, "max_tokens": 2}


def _assert_refused(response: httpx.Response, status: int | None = None) -> dict:
    """A 4xx (or the given status) with exactly OpenAI's error body and nothing internal."""
    assert 400 <= response.status_code < 500 and response.status_code != 422, response.text
    if status is not None:
        assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in response.text and 'File "' not in response.text
    assert response.headers["x-request-id"]
    return error


@pytest.fixture
def post(server, api_key) -> Iterator:
    """POST raw bytes or JSON to /v1/chat/completions with the funded key."""
    with httpx.Client(base_url=server.base_url, timeout=30) as http:

        def send(body: bytes | object, **headers: str) -> httpx.Response:
            headers.setdefault("Authorization", f"Bearer {api_key}")
            if isinstance(body, bytes):
                headers.setdefault("Content-Type", "application/json")
                return http.post("/chat/completions", content=body, headers=headers)
            return http.post("/chat/completions", json=body, headers=headers)

        yield send
    _assert_healthy(server, api_key)


def _assert_healthy(server, api_key: str) -> None:
    """The server still answers a normal request after the abuse."""
    root = server.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/ready").status_code == 200
    answer = httpx.post(
        f"{server.base_url}/chat/completions",
        json=VALID,
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert engine_idle(server)


def engine_idle(server) -> bool:
    stats = server.services.engines["demo"].stats()
    return stats.active_sequences == 0 and stats.queued_sequences == 0


MALFORMED_BODIES = [
    b"",
    b"{not json",
    b'{"model": "demo", "messages": [',
    b"null",
    b"[]",
    b'"text"',
    b"42",
    b"\xff\xfe\xfd",  # not UTF-8 at all
    b'{"model": "demo", "messages": [{"role": "user", "content": "caf\xe9"}]}',  # latin-1 byte
    b'{"model": "demo\x00", "messages": []}',  # a raw NUL inside a JSON string
    b"[" * 100_000 + b"]" * 100_000,  # nesting deep enough to blow a recursive parser
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": NaN}',
    b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
    b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "top_p": NaN}',
    b'{"model": "demo", "model": 5, "messages": [{"role": "user", "content": "hi"}]}',
]


@pytest.mark.parametrize("body", MALFORMED_BODIES, ids=range(len(MALFORMED_BODIES)))
def test_malformed_json_is_a_400(post, body):
    _assert_refused(post(body), 400)


WRONG_FIELDS = [
    {"model": 5},
    {"model": ""},
    {"model": None},
    {"model": ["demo"]},
    {"messages": "hello"},
    {"messages": [5]},
    {"messages": [None]},
    {"messages": [{"content": "no role"}]},
    {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "user", "content": {"text": "x"}}]},
    {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
    {"messages": [{"role": "user", "content": [5]}]},
    {"messages": [{"role": "user", "content": None}]},
    {"messages": [{"role": "tool", "content": "x"}]},
    {"max_tokens": "ten"},
    {"max_tokens": 1.5},
    {"max_tokens": True},
    {"max_tokens": [1]},
    {"temperature": "hot"},
    {"stream": "yes please"},
    {"stream_options": {"include_usage": True}},  # without stream
    {"stream": True, "stream_options": "usage"},
    {"n": None},
    {"stop": 5},
    {"stop": [1, 2]},
    {"stop": ""},
    {"stop": ["a", "b", "c", "d", "e"]},
    {"seed": "x"},
    {"seed": 1.5},
    {"logprobs": "yes"},
    {"top_logprobs": 5},  # without logprobs
    {"top_logprobs": 21, "logprobs": True},
    {"user": {"id": 1}},
    {"response_format": "json"},
    {"logit_bias": {"1": "x"}},
]


@pytest.mark.parametrize("extra", WRONG_FIELDS, ids=[json.dumps(f)[:40] for f in WRONG_FIELDS])
def test_wrong_types_are_a_400_naming_nothing_internal(post, extra):
    error = _assert_refused(post(VALID | extra), 400)
    assert error["type"] == "invalid_request_error"


ABSURD_NUMBERS = [
    {"max_tokens": -1},
    {"max_tokens": 0},
    {"max_tokens": -(2**63)},
    {"max_completion_tokens": -5},
    {"n": -1},
    {"n": 0},
    {"n": 9},  # past MAX_N
    {"n": 10**9},
    {"n": 2**64},
    {"temperature": -0.1},
    {"temperature": 2.01},
    {"temperature": 1e308},
    {"temperature": -1e308},
    {"top_p": 0},
    {"top_p": 1.5},
    {"presence_penalty": 1e9},
    {"frequency_penalty": -3},
    {"top_logprobs": -1, "logprobs": True},
]


@pytest.mark.parametrize("extra", ABSURD_NUMBERS, ids=[json.dumps(f) for f in ABSURD_NUMBERS])
def test_absurd_numbers_are_a_400(post, extra):
    _assert_refused(post(VALID | extra), 400)


@pytest.mark.parametrize(
    "extra",
    [
        {"max_tokens": 10**12},
        {"max_tokens": 2**63},
        {"max_tokens": 10**30},
        {"max_completion_tokens": 2**64},
        {"seed": -1},
        {"seed": 2**64},
        {"seed": -(10**30)},
        {"seed": 10**30},
    ],
    ids=str,
)
def test_huge_but_legal_numbers_are_capped_or_refused_never_a_500(post, extra):
    response = post(VALID | extra | {"max_tokens": extra.get("max_tokens", 2)})
    if response.status_code != 200:
        _assert_refused(response, 400)


def test_a_huge_body_is_413_declared_or_streamed(start_server, api_key):
    server = start_server(max_request_bytes=50_000)
    url = f"{server.base_url}/chat/completions"
    auth = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    huge = json.dumps(VALID | {"messages": [{"role": "user", "content": "x" * 200_000}]})
    _assert_refused(httpx.post(url, content=huge, headers=auth), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        yield huge.encode()[:1000]
        for _ in range(100):
            yield b" " * 1000

    _assert_refused(httpx.post(url, content=chunks(), headers=auth), 413)
    _assert_healthy(server, api_key)


def test_thousands_of_messages_are_refused_past_the_limit(post, server):
    limit = server.services.settings.max_messages
    too_many = [{"role": "user", "content": "hi"}] * (limit + 1)
    error = _assert_refused(post({"model": "demo", "messages": too_many}), 400)
    assert error["param"] == "messages"
    within = [{"role": "user", "content": "hi " * 80}] * limit  # allowed, but past the window
    error = _assert_refused(post({"model": "demo", "messages": within}), 400)
    assert error["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    "content",
    ["nul \x00 inside", "\ud800 lone surrogate", "\udfff", "a\ud83d", "\x00"],
    ids=["nul", "high-surrogate", "low-surrogate", "half-pair", "only-nul"],
)
def test_nul_bytes_and_lone_surrogates_are_a_400(post, content):
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": content}]})
    _assert_refused(post(body.encode()), 400)
    parts = [{"type": "text", "text": content}]
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": parts}]})
    _assert_refused(post(body.encode()), 400)


@pytest.mark.parametrize("field", ["model", "stop", "user"])
def test_surrogates_and_nuls_in_other_strings_do_not_break_anything(post, field):
    for value in ("\ud800", "x\x00y"):
        body = json.dumps(VALID | {field: value}).encode()
        response = post(body)
        if response.status_code != 200:
            _assert_refused(response)


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_past_the_context_window_is_400_streaming_or_not(post, server, stream):
    window = server.services.engines["demo"].context_length
    long_prompt = [{"role": "user", "content": "word " * (window * 2)}]
    error = _assert_refused(post({"model": "demo", "messages": long_prompt, "stream": stream}), 400)
    assert error["code"] == "context_length_exceeded"


OTHER_KEYS = [
    "sk-" + "a" * 48,  # OpenAI's legacy format
    "sk-proj-" + "A1b2" * 39,  # OpenAI's project keys
    "sk-ant-api03-" + "x" * 90,  # another vendor's
    "sk-tks-" + "A" * 46,  # ours, wrong checksum
    "sk-tks-" + "A" * 45,  # ours, one character short
    "sk-tks-" + "A" * 4000,  # very long
    keys.derive_key(b"another shop's secret", "salt"),  # well formed, unknown
    "sk-tks-" + "é" * 46,  # non-ASCII (sent as UTF-8 bytes)
    "Bearer sk-tks-nested",
    "' OR 1=1 --",
    "%00%0d%0a",
]


@pytest.mark.parametrize("key", OTHER_KEYS, ids=range(len(OTHER_KEYS)))
def test_keys_of_other_formats_are_401_and_never_echoed(server, key):
    response = _raw_request(server, f"Authorization: Bearer {key}".encode())
    error = _assert_refused(response, 401)
    assert error["code"] == "invalid_api_key"
    assert key not in response.text


@pytest.mark.parametrize(
    "header",
    [
        b"Authorization: Basic dXNlcjpwYXNz",
        b"Authorization: bearer",
        b"Authorization: Bearer ",
        b"Authorization: Token sk-tks-x",
        b"Authorization: " + b"Bearer " + b"\xff\xfe" * 20,
        b"Authorization: Bearer sk-tks-\xc3\xa9\xc3\xa9",
    ],
    ids=range(6),
)
def test_odd_authorization_headers_are_401(server, header):
    response = _raw_request(server, header)
    _assert_refused(response, 401)


@pytest.mark.parametrize(
    "header",
    [
        b"Authorization: Bearer sk-tks-abc\r\nX-Injected: 1",  # becomes a header of its own
        b"Authorization: Bearer sk-tks-abc\rX-Injected: 1",  # a bare CR: h11 refuses the request
        b"Authorization: Bearer sk-tks-abc\nX-Injected: 1",
        b"Authorization: Bearer sk-tks-\x00abc",  # a NUL: the HTTP parser refuses it
    ],
    ids=["crlf", "cr", "lf", "nul"],
)
def test_header_injection_in_the_key_is_refused(server, api_key, header):
    response = _raw_request(server, header)
    assert response.status_code in (400, 401), response.text
    assert "x-injected" not in response.headers
    assert "Traceback" not in response.text
    _assert_healthy(server, api_key)


def test_a_key_header_past_the_size_limit_is_refused_and_the_server_lives(server, api_key):
    response = _raw_request(server, b"Authorization: Bearer sk-tks-" + b"A" * 200_000)
    assert 400 <= response.status_code < 500
    assert "Traceback" not in response.text
    _assert_healthy(server, api_key)


def _raw_request(server, header: bytes) -> httpx.Response:
    """Send a request over a bare socket, so headers httpx would refuse reach the server."""
    body = json.dumps(VALID).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + header
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, content = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines if ": " in line)
    if headers.get("transfer-encoding") == "chunked":
        content = _unchunk(content)
    return httpx.Response(int(status_line.split()[1]), headers=headers, content=content)


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


def test_unknown_methods_routes_and_model_ids_are_openai_shaped(server, api_key):
    auth = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=server.base_url, headers=auth) as http:
        _assert_refused(http.get("/chat/completions"), 405)
        _assert_refused(http.delete("/models"), 405)
        _assert_refused(http.get("/nope"), 404)
        _assert_refused(http.get("/models/" + "x" * 5000), 404)
        _assert_refused(http.get("/models/%00%ff"), 404)
        _assert_refused(http.post("/chat/completions?stream=true", content=b"{}"), 400)
        response = http.post(
            "/chat/completions", json=VALID, headers={"Idempotency-Key": "k" * 300}
        )
        _assert_refused(response, 400)
    _assert_healthy(server, api_key)


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": 5},
        {"n": 0},
        {"max_tokens": -1},
        {"messages": []},
        {"messages": [{"role": "user", "content": "nul \x00"}]},
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        {"model": "no-such-model"},
    ],
    ids=["temperature", "n", "max_tokens", "no-messages", "nul", "tools", "model"],
)
def test_a_refused_streaming_request_gets_a_plain_json_error_not_a_stream(post, extra):
    """The SDK raises the error before iterating only if it arrives as a status, not as an
    event inside a 200 stream."""
    response = post(VALID | {"stream": True} | extra)
    assert response.headers["content-type"].startswith("application/json")
    _assert_refused(response)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/plain", b"hello"),
        ("application/x-www-form-urlencoded", b"model=demo&messages=hi"),
        ("multipart/form-data; boundary=x", b"--x\r\n\r\n--x--\r\n"),
        ("application/json; charset=latin-1", b'{"model": "d\xe9mo"}'),
    ],
    ids=["text", "form", "multipart", "latin-1"],
)
def test_bodies_that_are_not_a_json_object_are_a_400(post, content_type, body):
    _assert_refused(post(body, **{"Content-Type": content_type}), 400)


def test_tens_of_thousands_of_content_parts_are_answered_or_refused_never_a_500(post):
    parts = [{"type": "text", "text": ""}] * 50_000 + [{"type": "text", "text": "hi"}]
    response = post({"model": "demo", "messages": [{"role": "user", "content": parts}]})
    if response.status_code != 200:
        _assert_refused(response, 400)
    too_long = [{"type": "text", "text": "word " * 8}] * 20_000  # past the context window
    error = _assert_refused(
        post({"model": "demo", "messages": [{"role": "user", "content": too_long}]}), 400
    )
    assert error["code"] == "context_length_exceeded"
