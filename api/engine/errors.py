"""Errors the engine raises; the API maps each to an OpenAI error once, in `api/errors.py`.

EngineError
├── ModelLoadError          an export dir is missing a file or has an unusable graph
├── ContextLengthExceeded   the prompt alone does not fit the model's context window
├── EngineOverloaded        the queue of waiting requests is full
├── InvalidParameter        a request parameter the model cannot take (a token past its vocab)
│   └── InvalidGrammar      llguidance cannot compile a request's schema or grammar
├── ToolsUnsupported        the model's chat template cannot show tools
├── EngineDead              the scheduler thread has stopped
├── UpstreamUnavailable     no upstream server of the model answered before the first token
├── UpstreamFailed          an upstream server failed after its first token
└── UpstreamRejected        an upstream server refused the request (a 4xx with its message)
"""


class EngineError(Exception):
    """Base of every engine error."""


class ModelLoadError(EngineError):
    """Raised when an export dir cannot be served; the message names the file and what is wrong."""


class ContextLengthExceeded(EngineError):
    """Raised when prompt tokens alone reach the context window."""

    def __init__(self, prompt_tokens: int, context_length: int) -> None:
        super().__init__(
            f"This model's maximum context length is {context_length} tokens, "
            f"but the prompt has {prompt_tokens} tokens."
        )
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length


class EngineOverloaded(EngineError):
    """Raised when `max_queued` requests are already waiting."""


class InvalidParameter(EngineError):
    """Raised when a request parameter does not fit the model (`logit_bias` naming a token id
    past its vocabulary); `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class InvalidGrammar(InvalidParameter):
    """Raised when llguidance cannot compile a request's constraint; `param` names the request
    parameter it came from (`response_format`, `tools[0].function.parameters`, ...)."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(param, f"'{param}' cannot be enforced: {reason}")


class ToolsUnsupported(EngineError):
    """Raised when a request has tools and the model's chat template does not render them."""


class EngineDead(EngineError):
    """Raised when the scheduler thread has stopped and the model cannot serve."""


class UpstreamUnavailable(EngineError):
    """Raised when every upstream of a model refused the connection, answered 5xx or timed out
    before the first token: nothing was generated, nothing is billed."""


class UpstreamFailed(EngineError):
    """Raised when an upstream's stream broke after its first token; what arrived is billed."""


class UpstreamRejected(EngineError):
    """Raised when an upstream refused the request itself (400, 404, 413, 422): the client gets
    the same status with the upstream's message, and the prompt is not billed."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code
