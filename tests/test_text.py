"""Streaming text assembly: UTF-8 never split, stop strings never leaked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oxillama.text.assembler import TextAssembler


def run(pieces: list[bytes], stop: list[str]) -> tuple[list[str], TextAssembler]:
    a = TextAssembler(stop)
    out = [a.push(p) for p in pieces]
    out.append(a.finish())
    return [o for o in out if o], a


def test_multibyte_character_split_across_tokens() -> None:
    emoji = "🎉".encode()
    out, a = run([b"a", emoji[:1], emoji[1:3], emoji[3:], b"b"], [])
    assert out == ["a", "🎉", "b"] and a.text == "a🎉b"


def test_stop_string_spanning_tokens_is_cut_and_never_emitted() -> None:
    out, a = run([b"hello wo", b"rld!", b" more"], ["world"])
    assert "".join(out) == "hello " and a.stopped and a.text == "hello "


def test_partial_stop_prefix_is_released_when_it_does_not_match() -> None:
    out, a = run([b"wor", b"m and more"], ["world"])
    assert "".join(out) == "worm and more" and not a.stopped


def test_earliest_of_several_stops_wins() -> None:
    _, a = run([b"x END y STOP"], ["STOP", "END"])
    assert a.text == "x "


@given(st.text(min_size=0, max_size=60), st.lists(st.integers(1, 7), max_size=20))
def test_any_chunking_yields_the_same_text(text: str, cuts: list[int]) -> None:
    data = text.encode()
    pieces, i = [], 0
    for c in cuts:
        pieces.append(data[i : i + c])
        i += c
    pieces.append(data[i:])
    out, a = run(pieces, [])
    assert "".join(out) == text == a.text
    assert all("\ufffd" not in o for o in out)


@given(st.text(alphabet="abc", max_size=40), st.text(alphabet="abc", min_size=1, max_size=3))
def test_stop_semantics_match_str_find(text: str, stop: str) -> None:
    out, a = run([c.encode() for c in text], [stop])
    want = text[: text.find(stop)] if stop in text else text
    assert "".join(out) == want == a.text
