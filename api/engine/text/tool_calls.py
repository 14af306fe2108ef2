"""Tool calls in a model's own syntax: found in its output (streaming included) and enforced.

Each chat-template family writes calls its own way:

- `hermes` (Qwen2.5, Hermes, the demo model): `<tool_call>\\n{"name": "f", "arguments": {...}}
  \\n</tool_call>`, one block per call, anywhere in the answer;
- `llama3` (Llama 3.1+ JSON tool calling): the answer is `{"name": "f", "parameters": {...}}`,
  calls separated by `; `;
- `mistral`: the answer is `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`.

`ToolCallParser` is fed the answer's text deltas and returns events: content, a call's start
(its name), fragments of its arguments. Text that may begin a call is held back until it is
known not to (never sent as content and then taken back); a would-be call that turns out
malformed is released as content. A whole answer is parsed by the same machine (`parse`), so a
streamed answer assembles to exactly the non-streamed one.

`call_grammar` writes the Lark grammar (llguidance) that makes a model write calls of this
syntax with arguments valid for each function's JSON schema: all of its output for
`tool_choice` "required" or a named function, or lazily after the call's opening for `auto`.
Nothing here knows OpenAI's wire shapes: the Chat Completions and Responses fronts both use it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Mode = Literal["required", "auto"]


@dataclass(frozen=True)
class ToolCallFormat:
    """How one template family writes a call (see the module docstring)."""

    name: str
    open: str  # text that opens a call, before `{"name": ...`
    close: str  # text after a call's JSON object
    separator: str  # between two calls
    arguments_key: str  # "arguments" or "parameters"
    anywhere: bool  # calls may follow content (else only at the answer's start)
    list_open: str = ""  # around all the calls (mistral's JSON list)
    list_close: str = ""

    @property
    def trigger(self) -> str:
        """The text whose appearance starts a call (the opening without its spacing)."""
        return self.open.strip() or self.list_open or "{"

    def header(self, function: str) -> str:
        """A call's text up to its arguments, as the template renders past calls."""
        return f'{self.open}{{"name": {json.dumps(function)}, "{self.arguments_key}": '


HERMES = ToolCallFormat(
    "hermes", open="<tool_call>\n", close="\n</tool_call>", separator="\n",
    arguments_key="arguments", anywhere=True,
)  # fmt: skip
LLAMA3 = ToolCallFormat(
    "llama3", open="", close="", separator="; ", arguments_key="parameters", anywhere=False
)
MISTRAL = ToolCallFormat(
    "mistral", open="", close="", separator=", ", arguments_key="arguments", anywhere=False,
    list_open="[TOOL_CALLS][", list_close="]",
)  # fmt: skip
FORMATS = {f.name: f for f in (HERMES, LLAMA3, MISTRAL)}


def detect_format(template_source: str) -> ToolCallFormat | None:
    """The family of a chat template that renders tools, or None when it renders none."""
    if "tools" not in template_source:
        return None
    if "<tool_call>" in template_source:
        return HERMES
    if "[TOOL_CALLS]" in template_source:
        return MISTRAL
    if "<|python_tag|>" in template_source or "<|eom_id|>" in template_source:
        return LLAMA3
    return None


# ---- parsing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int  # the call's position among this answer's calls
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    text: str  # a fragment of the call's JSON arguments


Event = Content | CallStart | CallArguments


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as the model wrote it


class _JsonValueEnd:
    """Finds where one JSON value ends in text fed piece by piece (depth and strings only:
    the value's validity is the client's to judge, or the grammar's to ensure)."""

    def __init__(self) -> None:
        self.depth = 0
        self.started = False
        self.in_string = False
        self.escaped = False
        self.done = False

    def feed(self, text: str) -> int:
        """Characters of `text` that belong to the value (all of them unless it ended)."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        self.done = True
                        return i + 1
                continue
            if not self.started and ch in " \t\r\n":
                continue
            self.started = True
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    self.done = True
                    return i + 1
            elif self.depth == 0 and ch in ",;\n" and i > 0:
                self.done = True  # a bare number / literal ended
                return i
        return len(text)


_FAIL = "fail"
_PARTIAL = "partial"


def _match_header(buf: str, fmt: ToolCallFormat) -> tuple[str, str, int]:
    """Match `{"name": "<name>", "<arguments_key>":` (whitespace allowed between JSON tokens)
    at the start of `buf`: ("ok", name, length), (_PARTIAL, "", 0) or (_FAIL, "", 0)."""
    pos = 0
    name = ""

    def skip_ws() -> None:
        nonlocal pos
        while pos < len(buf) and buf[pos] in " \t\r\n":
            pos += 1

    def literal(text: str) -> str | None:
        nonlocal pos
        part = buf[pos : pos + len(text)]
        if not text.startswith(part):
            return _FAIL
        if len(part) < len(text):
            return _PARTIAL
        pos += len(text)
        return None

    for step in ("{", '"name"', ":", "NAME", ",", f'"{fmt.arguments_key}"', ":"):
        skip_ws()
        if pos >= len(buf):
            return _PARTIAL, "", 0
        if step == "NAME":
            if buf[pos] != '"':
                return _FAIL, "", 0
            end = pos + 1
            while end < len(buf) and buf[end] != '"':
                end += 2 if buf[end] == "\\" else 1
            if end >= len(buf):
                return (_PARTIAL if end - pos < 256 else _FAIL), "", 0
            try:
                name = json.loads(buf[pos : end + 1])
            except ValueError:
                return _FAIL, "", 0
            pos = end + 1
            continue
        outcome = literal(step)
        if outcome is not None:
            return outcome, "", 0
    skip_ws()
    if pos >= len(buf):
        return _PARTIAL, "", 0  # the arguments' first character tells a call from text
    return "ok", name, pos


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class ToolCallParser:
    """Feed an answer's text deltas; get content and call events back (module docstring)."""

    def __init__(self, fmt: ToolCallFormat) -> None:
        self.fmt = fmt
        self.calls: list[ParsedCall] = []
        self._buf = ""  # text not yet given out
        self._state: Literal[
            "text", "between", "list", "header", "args", "close", "after", "plain"
        ] = "text" if fmt.anywhere else "list"
        self._held = ""  # everything since the call (list) opened: content if it fails
        self._args: list[str] = []
        self._scanner = _JsonValueEnd()
        self._name = ""

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        """The end of the answer: anything still held back is content."""
        events = self._run(final=True)
        if self._state == "args":  # cut off inside arguments: the call stands as written
            self._end_call()
        elif self._held or self._buf:
            events.append(Content(self._held + self._buf))
        self._held = self._buf = ""
        return [e for e in events if not (isinstance(e, Content) and not e.text)]

    def _run(self, *, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            before = (self._state, len(self._buf))
            events.extend(self._step(final))
            if (self._state, len(self._buf)) == before:
                return events

    def _step(self, final: bool) -> list[Event]:
        fmt = self.fmt
        if self._state == "between":  # after a call: blank lines before another are no content
            rest = self._buf.lstrip()
            if not rest and not final:
                return []
            if not rest or rest.startswith(fmt.trigger):
                self._buf = rest
            elif not final and fmt.trigger.startswith(rest):
                return []
            self._state = "text"
            return []
        if self._state == "plain":
            out, self._buf = self._buf, ""
            return [Content(out)] if out else []
        if self._state == "text":
            opener = fmt.trigger
            at = self._buf.find(opener)
            if at < 0:
                keep = 0 if final else _partial_suffix(self._buf, opener)
                out = self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(out) :]
                return [Content(out)] if out else []
            out = self._buf[:at]
            self._held = opener
            self._buf = self._buf[at + len(opener) :]
            self._state = "header"
            return [Content(out)] if out else []
        if self._state == "list":  # calls only at the start: the list opening, then a header
            stripped = self._buf.lstrip()
            opening = fmt.list_open
            alternatives = [opening, opening.replace("[TOOL_CALLS]", "")] if opening else [""]
            for alt in alternatives:
                if stripped.startswith(alt) and (alt or stripped):
                    self._held = self._buf[: len(self._buf) - len(stripped) + len(alt)]
                    self._buf = stripped[len(alt) :]
                    self._state = "header"
                    return []
            if not final and any(alt.startswith(stripped) for alt in alternatives):
                return []
            self._state = "plain"
            return []
        if self._state == "header":
            outcome, name, size = _match_header(self._buf, fmt)
            if outcome == _PARTIAL and not final:
                return []
            if outcome != "ok":  # not a call after all: what was held is content
                self._state = "text" if fmt.anywhere else "plain"
                out, self._held = self._held, ""
                return [Content(out)]
            self._held += self._buf[:size]
            self._buf = self._buf[size:]
            self._name = name
            self._args = []
            self._scanner = _JsonValueEnd()
            self._state = "args"
            return [CallStart(len(self.calls), name)]
        if self._state == "args":
            used = self._scanner.feed(self._buf)
            piece, self._buf = self._buf[:used], self._buf[used:]
            self._args.append(piece)
            events: list[Event] = [CallArguments(len(self.calls), piece)] if piece else []
            if self._scanner.done:
                self._end_call()
                self._state = "close"
            return events
        if self._state == "after":
            return self._after(final)
        # "close": the object's "}", then the call's closing text
        return self._close(final)

    def _end_call(self) -> None:
        self.calls.append(ParsedCall(self._name, "".join(self._args).strip()))
        self._held = ""

    def _close(self, final: bool) -> list[Event]:
        fmt = self.fmt
        outcome, size = _match_literals(self._buf, ["}", fmt.close.strip()])
        if outcome == _PARTIAL and not final:
            return []
        if outcome != "ok":  # a malformed ending: what follows is content
            self._state = "text" if fmt.anywhere else "plain"
            return []
        self._buf = self._buf[size:]
        self._state = "between" if fmt.anywhere else "after"
        return []

    def _after(self, final: bool) -> list[Event]:
        """After a call of a whole-answer format: a separator and the next call, the list's
        end, or text (content)."""
        fmt = self.fmt
        outcome, size = _match_literals(self._buf, [fmt.separator.strip()])
        if outcome == "ok":
            self._buf = self._buf[size:]
            self._state = "header"
            return []
        waiting = outcome == _PARTIAL
        if fmt.list_close:
            outcome, size = _match_literals(self._buf, [fmt.list_close])
            if outcome == "ok":
                self._buf = self._buf[size:]
                self._state = "plain"
                return []
            waiting = waiting or outcome == _PARTIAL
        if waiting and not final:
            return []
        self._state = "plain"
        return []


def _match_literals(buf: str, literals: Sequence[str]) -> tuple[str, int]:
    """Match `literals` in order at the start of `buf`, whitespace allowed before each:
    ("ok", length), (_PARTIAL, 0) when `buf` ends before they do, or (_FAIL, 0)."""
    pos = 0
    for literal in literals:
        while pos < len(buf) and buf[pos] in " \t\r\n":
            pos += 1
        part = buf[pos : pos + len(literal)]
        if not literal.startswith(part):
            return _FAIL, 0
        if len(part) < len(literal):
            return _PARTIAL, 0
        pos += len(literal)
    return "ok", pos


def parse(fmt: ToolCallFormat, text: str) -> tuple[str, list[ParsedCall]]:
    """A whole answer's content and calls (the same machine as streaming)."""
    parser = ToolCallParser(fmt)
    events = [*parser.feed(text), *parser.finish()]
    content = "".join(e.text for e in events if isinstance(e, Content))
    return content, parser.calls


# ---- enforcing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionSpec:
    """A function the model may call: its name and the JSON schema of its arguments
    (None: any JSON object)."""

    name: str
    parameters: Mapping[str, Any] | None


def _lark_string(text: str) -> str:
    return json.dumps(text)


def _arguments_schema(fmt: ToolCallFormat, parameters: Mapping[str, Any] | None) -> str:
    """The schema as llguidance's `%json` takes it, written with the spacing the template
    uses for past calls (`tojson`: ", " and ": "), so the model sees its own style."""
    return json.dumps(with_spacing(parameters or {"type": "object"}, ", ", ": "))


def with_spacing(schema: Mapping[str, Any], item: str, key: str) -> dict[str, Any]:
    """`schema` with llguidance's options for exactly this JSON spacing (no free whitespace:
    a model cannot pad its answer with blank lines until it runs out of tokens)."""
    out: dict[str, Any] = dict(schema)
    guidance: dict[str, Any] = dict(out.get("x-guidance") or {})
    guidance.update(whitespace_flexible=False, item_separator=item, key_separator=key)
    out["x-guidance"] = guidance
    return out


def call_grammar(
    fmt: ToolCallFormat,
    functions: Sequence[FunctionSpec],
    *,
    mode: Mode,
    parallel: bool,
) -> str:
    """An llguidance Lark grammar for calls to `functions` in `fmt`'s syntax.

    "required": the whole answer is one call (several when `parallel`); "auto": free text in
    which each call, once its opening is written, must be complete and valid."""
    if not functions:
        raise ValueError("call_grammar needs at least one function")
    lines = ["%llguidance {}"]
    bodies = []
    for i, function in enumerate(functions):
        header = fmt.header(function.name)
        body = (
            f"{_lark_string(header[len(fmt.open) :])} %json "
            f"{_arguments_schema(fmt, function.parameters)} {_lark_string('}' + fmt.close)}"
        )
        bodies.append((f"call_{i}", body))
    alternatives = " | ".join(name for name, _ in bodies)
    if mode == "required":
        opener = _lark_string(fmt.open) if fmt.open else ""
        lines.append(f"call: {opener} ({alternatives})")
        more = f"({_lark_string(fmt.separator)} call)*" if parallel else ""
        open_list = _lark_string(fmt.list_open) if fmt.list_open else ""
        close_list = _lark_string(fmt.list_close) if fmt.list_close else ""
        lines.append(f"start: {open_list} call {more} {close_list}")
    elif fmt.anywhere:  # text, and calls wherever their opening is written
        trigger = fmt.trigger
        lines.append("start: (call)* TEXT")
        lines.append("TEXT: /(.|\\n)*/")
        lines.append(f"opening[lazy]: TEXT {_lark_string(trigger)}")
        rest = fmt.open[len(trigger) :]
        lines.append(f"call: opening {_lark_string(rest) if rest else ''} ({alternatives})")
    else:  # calls only as the whole answer: either they, or text that cannot begin them
        first = fmt.trigger[0]
        lines.append(f"call: {_lark_string(fmt.open) if fmt.open else ''} ({alternatives})")
        more = f"({_lark_string(fmt.separator)} call)*" if parallel else ""
        open_list = _lark_string(fmt.list_open) if fmt.list_open else ""
        close_list = _lark_string(fmt.list_close) if fmt.list_close else ""
        lines.append(f'start: {open_list} call {more} {close_list} | TEXT | ""')
        lines.append(f"TEXT: /[^{re.escape(first)} \\t\\n](.|\\n)*/")
    for name, body in bodies:
        lines.append(f"{name}: {body}")
    return "\n".join(lines) + "\n"


def functions_of(tools: Iterable[Mapping[str, Any]]) -> list[FunctionSpec]:
    """OpenAI function tools (`{"type": "function", "function": {...}}`) as `FunctionSpec`s."""
    return [
        FunctionSpec(tool["function"]["name"], tool["function"].get("parameters")) for tool in tools
    ]
