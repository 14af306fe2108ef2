"""`LocalEngine`: the `EngineClient` that serves one ONNX export with the batching scheduler.

It owns the pieces loaded from an export dir (graph, tokenizer, chat template) and turns the
contract's calls into scheduler operations. `generate` checks the request and queues it right
away (so `EngineOverloaded` / `ContextLengthExceeded` surface at the call, before any response
is started) and returns a stream that reads the request's asyncio queue.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from api.engine.errors import (
    ContextLengthExceeded,
    EngineDead,
    InvalidParameter,
    ModelLoadError,
    ToolsUnsupported,
)
from api.engine.model.causal_lm import OnnxCausalLM, read_json
from api.engine.model.serving_path import log_path
from api.engine.protocol import (
    ChatMessage,
    Constraint,
    EngineClient,
    EngineStats,
    GenerationOutput,
    GenerationRequest,
    KvCacheDtype,
    ServingPath,
)
from api.engine.runtime.constraints import Grammars
from api.engine.runtime.scheduler import END, Scheduler, SchedulerLimits
from api.engine.runtime.sequence import Sequence as EngineSequence
from api.engine.text.chat_template import ChatTemplate, select_template, special_token_strings
from api.engine.text.tokenizer import TokenizerWrapper
from api.engine.text.tool_calls import detect_format

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def load_chat_template(path: Path) -> ChatTemplate:
    """The export's template (tokenizer_config.json or chat_template.jinja), else ChatML."""
    tokenizer_config = read_json(path / TOKENIZER_CONFIG_FILE, required=False)
    special = read_json(path / SPECIAL_TOKENS_FILE, required=False)
    source = select_template(tokenizer_config.get("chat_template"))
    jinja_file = path / CHAT_TEMPLATE_FILE
    if source is None and jinja_file.is_file():
        source = jinja_file.read_text(encoding="utf-8")
    try:
        return ChatTemplate(source, special_token_strings(special, tokenizer_config))
    except ValueError as exc:
        raise ModelLoadError(f"{path / TOKENIZER_CONFIG_FILE}: {exc}") from exc


def _fingerprint(model_id: str, path: Path, *settings: str) -> str:
    """`fp_` and 10 hex digits over the model's id and files (names, sizes, the small ones'
    bytes: config, tokenizer, template) and the engine settings it is served with."""
    digest = hashlib.sha256(model_id.encode())
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        if size < 1 << 20:
            digest.update(file.read_bytes())
    for setting in settings:
        digest.update(setting.encode())
    return f"fp_{digest.hexdigest()[:10]}"


class GenerationStream(AsyncIterator[GenerationOutput]):
    """Outputs of one request. Closing it early (or dropping it) aborts the request."""

    def __init__(self, sequence: EngineSequence, scheduler: Scheduler) -> None:
        self._sequence = sequence
        self._scheduler = scheduler
        self._done = False

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> GenerationOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._sequence.queue.get()
        except BaseException:
            self._abort()  # cancelled while waiting: the client is gone
            raise
        if item is END:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finished:
            self._done = True
        return item

    async def aclose(self) -> None:
        self._abort()

    def _abort(self) -> None:
        if not self._done:
            self._done = True
            self._scheduler.abort(self._sequence.request_id)

    def __del__(self) -> None:
        if not self._done:
            self._scheduler.abort(self._sequence.request_id)


class LocalEngine(EngineClient):
    """One export dir served by ONNX Runtime with continuous batching."""

    def __init__(
        self,
        model_id: str,
        path: Path,
        *,
        limits: SchedulerLimits | None = None,
        threads: int | None = None,
        cache_dir: Path | None = None,
        fused_attention: bool = True,
        ops_library: Path | None = None,
        ops_missing: str | None = None,  # why there is no ops_library (`serving_path`)
        kv_cache_dtype: KvCacheDtype = "auto",  # the server's default (ENGINE_KV_CACHE_DTYPE)
    ) -> None:
        if not path.is_dir():
            raise ModelLoadError(f"{path}: not a directory (expected an Optimum ONNX export)")
        self.model_id = model_id
        self.path = path
        self.model = OnnxCausalLM(
            path,
            threads=threads,
            cache_dir=cache_dir,
            fuse_attention=fused_attention,
            ops_library=ops_library,
            ops_missing=ops_missing,
            kv_cache_dtype=kv_cache_dtype,
        )
        log_path(model_id, self.model.serving_path)
        self.tokenizer = TokenizerWrapper.from_file(path / TOKENIZER_FILE)
        self.chat_template = load_chat_template(path)
        self._tool_format = detect_format(self.chat_template.source)
        self.grammars = Grammars(
            path / TOKENIZER_FILE,
            # the logits' width, which masks must cover (may exceed the tokenizer's size)
            vocab_size=int(self.model.config.get("vocab_size") or self.tokenizer.vocab_size),
            eos_token_ids=sorted(self.model.eos_token_ids),
        )
        self.context_length = self.model.context_length
        self._fingerprint = _fingerprint(
            model_id,
            path,
            repr(limits or SchedulerLimits()),
            f"threads={threads} fused={fused_attention} kv={kv_cache_dtype}",
            repr(getattr(self.model, "serving_path", None)),
        )
        self.created = int(time.time())
        self.scheduler = Scheduler(self.model, limits or SchedulerLimits(), name=model_id)

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        if (tools or any(m.tool_calls for m in messages)) and not self.chat_template.renders_tools:
            raise ToolsUnsupported(f"the chat template of {self.model_id} does not render tools")
        if tools and self._tool_format is None:  # calls could be neither read nor enforced
            raise ToolsUnsupported(
                f"the chat template of {self.model_id} writes tool calls in a syntax this "
                "service does not read (it reads Hermes/Qwen2.5, Llama 3 and Mistral's)"
            )
        return self.tokenizer.encode(self.chat_template.render(messages, tools=tools))

    def fingerprint(self) -> str:
        return self._fingerprint

    def tool_format(self) -> str | None:
        return self._tool_format.name if self._tool_format else None

    async def check_constraint(self, constraint: Constraint) -> None:
        # off the event loop: a large schema may take a while to compile (then it is cached)
        await asyncio.to_thread(self.grammars.compile, constraint)

    def generate(self, request: GenerationRequest) -> GenerationStream:
        prompt_tokens = len(request.prompt_token_ids)
        if prompt_tokens == 0:
            raise ValueError("the prompt has no tokens")
        if request.params.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if prompt_tokens >= self.context_length:
            raise ContextLengthExceeded(prompt_tokens, self.context_length)
        vocab = self.grammars.vocab_size
        for token, _ in request.params.logit_bias:
            if not 0 <= token < vocab:
                raise InvalidParameter(
                    "logit_bias",
                    f"Token id {token} is not in this model's vocabulary (0-{vocab - 1}).",
                )
        constraint = request.params.constraint
        sequence = EngineSequence(
            matcher=self.grammars.matcher(constraint) if constraint else None,
            request=request,
            tokenizer=self.tokenizer,
            eos_token_ids=self.model.eos_token_ids,
            context_length=self.context_length,
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
        )
        self.scheduler.submit(sequence)
        return GenerationStream(sequence, self.scheduler)

    def expect(self) -> Callable[[], None]:
        return self.scheduler.expect()

    async def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)

    def serving_path(self) -> ServingPath:
        return self.model.serving_path

    async def check_health(self) -> None:
        if not self.scheduler.alive:
            raise EngineDead(self.scheduler._dead_message())

    def stats(self) -> EngineStats:
        active, queued = self.scheduler.counts()
        speculator = self.scheduler.speculator
        return EngineStats(
            active_sequences=active,
            queued_sequences=queued,
            last_batch_size=self.scheduler.last_batch_size,
            steps=self.scheduler.steps,
            draft_tokens=speculator.proposed if speculator else 0,
            accepted_draft_tokens=speculator.accepted if speculator else 0,
        )

    async def start(self) -> None:
        self.scheduler.start()

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.scheduler.stop)
