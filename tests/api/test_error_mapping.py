"""Domain errors become the OpenAI errors a client can act on, never a bare 500."""

from __future__ import annotations

import pytest

from api.engine.errors import ContextLengthExceeded, EngineDead, EngineOverloaded
from api.engine.text.chat_template import ChatTemplateError
from api.errors import from_domain
from billing.errors import IdempotencyConflict, InsufficientBalance, RevokedKey


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (ChatTemplateError("Conversation roles must alternate"), 400, "invalid_messages"),
        (ContextLengthExceeded(5000, 2048), 400, "context_length_exceeded"),
        (InsufficientBalance(needed=10, available=3), 429, "insufficient_quota"),
        (RevokedKey(), 401, "invalid_api_key"),
        (IdempotencyConflict(), 409, "idempotency_conflict"),
        (EngineOverloaded(), 503, "overloaded"),
        (EngineDead(), 503, None),
        (RuntimeError("secret internals"), 500, "internal_error"),
    ],
)
def test_domain_errors_map_to_openai_errors(error, status, code):
    mapped = from_domain(error)
    assert (mapped.status, mapped.body.code) == (status, code)
    assert "secret internals" not in mapped.body.message
