"""Streamed text: never a broken UTF-8 character, never a partial stop string, and the deltas
of a request concatenate to exactly its final text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from api.engine.protocol import GenerationOutput
from api.engine.runtime.sampling import TokenChoice
from api.engine.text.stops import StopStringMatcher
from api.engine.text.tokenizer import IncrementalDetokenizer, TokenizerWrapper
from tests.engine.conftest import DEMO_DIR, greedy, make_engine, manual_sequence

TOKENIZER = TokenizerWrapper.from_file(DEMO_DIR / "tokenizer.json")
EOS = TOKENIZER.token_to_id("<|im_end|>")


def feed(tokens: list[int], *, stop: tuple[str, ...] = (), max_tokens: int = 1000):
    """Push chosen tokens through a request's text pipeline, as the scheduler would."""
    engine = make_engine(DEMO_DIR)
    sequence = manual_sequence(engine, greedy("t", [5, 6], max_tokens, stop=stop))
    outputs: list[GenerationOutput] = []
    for token in tokens:
        outputs.append(sequence.append(TokenChoice(token)))
        if sequence.finished:
            break
    return outputs


def test_a_character_split_over_byte_tokens_is_emitted_whole_once_complete() -> None:
    tokens = TOKENIZER.encode("a𝄞b")  # U+1D11E never occurs in the training text: 4 byte tokens
    assert len(tokens) >= 5
    detok = IncrementalDetokenizer(TOKENIZER)
    deltas = [detok.add(t) for t in tokens]
    assert all("\ufffd" not in d for d in deltas)
    assert deltas[1:4] == ["", "", ""]
    assert "".join(deltas) + detok.flush() == "a𝄞b"


def test_cyrillic_and_emoji_stream_without_replacement_characters() -> None:
    text = "Привет, мир! 東京 ✨ naïve 🦀🦀"
    outputs = feed(TOKENIZER.encode(text))
    assert all("\ufffd" not in o.text for o in outputs)
    assert "".join(o.text for o in outputs) == text  # nothing lost, even while unfinished


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=TOKENIZER.vocab_size - 1), max_size=40))
def test_deltas_concatenate_to_the_decoded_text_for_any_token_sequence(tokens: list[int]) -> None:
    detok = IncrementalDetokenizer(TOKENIZER)
    deltas = [detok.add(t) for t in tokens]
    assert "".join(deltas) + detok.flush() == TOKENIZER.decode(tokens)
    assert all(not d.endswith("\ufffd") for d in deltas)


def assert_stops_exactly_at(text: str, stop: str) -> None:
    """Generation of `text` with `stop` ends on the token completing the first `stop`, and the
    streamed text is exactly what precedes it, never more at any step."""
    tokens = TOKENIZER.encode(text)
    cut = text.index(stop)
    completing = next(k for k in range(1, len(tokens) + 1) if stop in TOKENIZER.decode(tokens[:k]))
    assert len(TOKENIZER.decode(tokens[: completing - 1])) > cut  # the stop spans tokens
    outputs = feed(tokens, stop=(stop, "zzz never"))
    sent = ""
    for output in outputs:
        sent += output.text
        assert text[:cut].startswith(sent)
    assert sent == text[:cut]
    assert outputs[-1].finish_reason == "stop" and outputs[-1].completion_tokens == completing


def test_stop_string_split_across_tokens_ends_generation_before_it() -> None:
    text = "the shop pays stars, hello world again"
    assert_stops_exactly_at(text, "o wor")
    assert_stops_exactly_at(text, "s, he")


def test_held_back_prefix_is_released_once_it_cannot_match() -> None:
    text = "hello world, hello"
    tokens = TOKENIZER.encode(text)
    outputs = feed(tokens, stop=("o wx",), max_tokens=len(tokens))
    sent = ""
    for output in outputs[:-1]:
        sent += output.text
        assert not sent.endswith(("o", "o ", "o w"))  # could still become "o wx": held
    assert sent + outputs[-1].text == text
    assert outputs[-1].finish_reason == "length"


def test_stop_string_made_of_a_split_multibyte_character() -> None:
    outputs = feed(TOKENIZER.encode("ok 𝄞 no"), stop=("𝄞",))
    assert "".join(o.text for o in outputs) == "ok "
    assert outputs[-1].finish_reason == "stop"


def test_matcher_finds_the_earliest_of_several_stop_strings() -> None:
    matcher = StopStringMatcher(["cd", "b"])
    assert matcher.feed("a") == ("a", False)
    assert matcher.feed("bcd") == ("", True)


def test_eos_ends_with_stop_and_flushes_held_text_without_the_eos_token() -> None:
    tokens = [*TOKENIZER.encode("hi wo"), EOS, *TOKENIZER.encode("never")]
    outputs = feed(tokens, stop=("world",))
    assert "".join(o.text for o in outputs) == "hi wo"
    assert outputs[-1].finish_reason == "stop" and outputs[-1].token_ids == [EOS]
    assert outputs[-1].completion_tokens == tokens.index(EOS) + 1


def test_max_tokens_ends_with_length_after_exactly_that_many_tokens() -> None:
    outputs = feed(TOKENIZER.encode("one two three four five six"), max_tokens=4)
    assert len(outputs) == 4 and outputs[-1].finish_reason == "length"
    assert [o.finished for o in outputs] == [False, False, False, True]
