"""SSE decoder: property round trips, a differential test against a naive spec parser,
and the quirks servers and routers produce."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.run.sse import (
    COMMENT,
    DATA,
    ERROR_EVENT,
    SSEDecoder,
    encode_comment,
    encode_event,
)

EOLS = [b"\n", b"\r\n", b"\r"]


# ----------------------------------------------------------------------------- helpers


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    """Split data at the given offsets (any order, duplicates allowed -> empty feeds)."""
    points = sorted(min(max(c, 0), len(data)) for c in cuts)
    pieces, prev = [], 0
    for p in points:
        pieces.append(data[prev:p])
        prev = p
    pieces.append(data[prev:])
    return pieces


def decode(pieces: list[bytes], flush: bool = True) -> list[tuple[int, bytes]]:
    d = SSEDecoder()
    out = []
    for p in pieces:
        out.extend(d.feed(p))
    if flush:
        out.extend(d.flush())
    return out


def ref_decode(stream: bytes) -> list[tuple[int, bytes]]:
    """A slow, literal reading of the WHATWG SSE parsing rules (plus our conventions:
    comments as events at block end, `event: error` reported, trailing event flushed)."""
    if stream.startswith(b"\xef\xbb\xbf"):
        stream = stream[3:]
    lines = re.split(rb"\r\n|\r|\n", stream)
    partial = lines.pop()
    out: list[tuple[int, bytes]] = []
    state = {"data": None, "event": None, "comments": []}

    def dispatch():
        out.extend((COMMENT, c) for c in state["comments"])
        if state["data"] is not None:
            kind = ERROR_EVENT if state["event"] == b"error" else DATA
            out.append((kind, b"\n".join(state["data"])))
        elif state["event"] == b"error":
            out.append((ERROR_EVENT, b""))
        state.update(data=None, event=None, comments=[])

    def process(line: bytes):
        if line.startswith(b":"):
            v = line[1:]
            state["comments"].append(v[1:] if v.startswith(b" ") else v)
            return
        if b":" in line:
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
        else:
            name, value = line, b""
        if name == b"data":
            state["data"] = (state["data"] or []) + [value]
        elif name == b"event":
            state["event"] = value

    for line in lines:
        if line == b"":
            dispatch()
        else:
            process(line)
    if partial:
        process(partial)
    dispatch()
    return out


# ----------------------------------------------------------------------------- strategies

# Data payloads: any bytes but b"\r" (SSE cannot carry it); b"\n" makes multi-line events.
payloads = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"x")) | st.text(
    alphabet=st.sampled_from(list('ab :{}"\n\xe9\u4e2d')), max_size=30
).map(str.encode)
comment_texts = st.binary(max_size=20).map(lambda b: b.replace(b"\r", b"x").replace(b"\n", b"y"))
events = st.lists(
    st.one_of(
        payloads.map(lambda p: (DATA, p)),
        comment_texts.map(lambda c: (COMMENT, c)),
        payloads.map(lambda p: (ERROR_EVENT, p)),
    ),
    max_size=12,
)
cuts = st.lists(st.integers(min_value=0, max_value=2000), max_size=12)


def encode(ev: tuple[int, bytes], eol: bytes) -> bytes:
    kind, payload = ev
    if kind == COMMENT:
        return encode_comment(payload, eol=eol)
    return encode_event(payload, eol=eol, event=b"error" if kind == ERROR_EVENT else None)


# Lines for the differential test: well-formed fields, odd fields, comments, blanks.
line_text = st.text(alphabet=st.sampled_from(list("ad: x\xe9")), max_size=8).map(str.encode)
lines = st.one_of(
    line_text.map(lambda t: b"data: " + t),
    line_text.map(lambda t: b"data:" + t),
    st.just(b"data"),
    line_text.map(lambda t: b":" + t),
    st.sampled_from([b"event: error", b"event:error", b"event: message", b"id: 7", b"retry: 10"]),
    st.just(b""),
    line_text,
)


# ----------------------------------------------------------------------------- properties


@settings(max_examples=400)
@given(evs=events, eol_idx=st.lists(st.integers(0, 2), min_size=1), cut=cuts)
def test_round_trip_any_eol_any_split(evs, eol_idx, cut):
    stream = b"".join(encode(ev, EOLS[eol_idx[i % len(eol_idx)]]) for i, ev in enumerate(evs))
    assert decode(split_at(stream, cut)) == evs
    # Terminated events need no flush.
    assert decode(split_at(stream, cut), flush=False) == evs


@settings(max_examples=300)
@given(evs=events, eol=st.sampled_from(EOLS))
def test_round_trip_byte_by_byte(evs, eol):
    stream = b"".join(encode(ev, eol) for ev in evs)
    assert decode([stream[i : i + 1] for i in range(len(stream))]) == evs


@settings(max_examples=500)
@given(
    ls=st.lists(st.tuples(lines, st.sampled_from(EOLS)), max_size=15),
    tail=st.booleans(),
    bom=st.booleans(),
    cut=cuts,
)
def test_matches_naive_spec_parser(ls, tail, bom, cut):
    stream = (b"\xef\xbb\xbf" if bom else b"") + b"".join(line + eol for line, eol in ls)
    if tail and ls:
        stream = stream[: -len(ls[-1][1])]  # last line unterminated
    expected = ref_decode(stream)
    assert decode([stream]) == expected
    assert decode(split_at(stream, cut)) == expected


@settings(max_examples=500)
@given(raw=st.binary(max_size=80).map(lambda b: bytes(b"\r\n: dat"[x % 7] for x in b)), cut=cuts)
def test_arbitrary_bytes_split_invariant(raw, cut):
    expected = ref_decode(raw)
    assert decode([raw]) == expected
    assert decode(split_at(raw, cut)) == expected


# ----------------------------------------------------------------------------- examples


def test_basic_lf_and_counters():
    d = SSEDecoder()
    assert d.feed(b'data: {"a":1}\n\ndata: [DONE]\n\n') == [(DATA, b'{"a":1}'), (DATA, b"[DONE]")]
    assert d.bytes_fed == 29
    assert d.events == 2 and d.comments == 0


def test_crlf_split_across_feeds():
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []
    # A lone \r already ends a line, so the blank line is complete: dispatch now,
    # and drop the \n that completes its \r\n in the next read.
    assert d.feed(b"\n\r") == [(DATA, b"a")]
    assert d.feed(b"\ndata: b\r\n\r\n") == [(DATA, b"b")]
    # \r\r and \r\n mixed, boundary split between the two \r
    assert d.feed(b"data: c\r") == []
    assert d.feed(b"\r") == [(DATA, b"c")]
    assert d.feed(b"\ndata: d\n\n") == [(DATA, b"d")]  # the \n after \r\r belongs to \r\n


def test_cr_only_boundaries():
    assert decode([b"data: a\r\rdata: b\r\r"]) == [(DATA, b"a"), (DATA, b"b")]


def test_multiline_data_joined_with_newline():
    assert decode([b"data: line1\ndata:line2\ndata\ndata:  x\n\n"]) == [
        (DATA, b"line1\nline2\n\n x")
    ]


def test_data_without_space_and_empty_data():
    assert decode([b"data:{}\n\ndata:\n\ndata\n\n"]) == [(DATA, b"{}"), (DATA, b""), (DATA, b"")]


def test_comments_ping_and_order():
    d = SSEDecoder()
    assert d.feed(b": ping\n\n") == [(COMMENT, b"ping")]
    assert d.feed(b":\n\n") == [(COMMENT, b"")]
    assert d.feed(b": a\ndata: x\n:b\n\n") == [(COMMENT, b"a"), (COMMENT, b"b"), (DATA, b"x")]
    assert d.comments == 4 and d.events == 1


def test_ignored_fields_and_block_without_data():
    assert decode([b"id: 1\nretry: 5\nevent: message\nfoo: bar\n\n"]) == []
    assert decode([b"id: 1\nevent: message\ndata: x\n\n"]) == [(DATA, b"x")]


def test_event_error():
    body = b'event: error\ndata: {"error": {"message": "boom"}}\n\n'
    assert decode([body]) == [(ERROR_EVENT, b'{"error": {"message": "boom"}}')]
    # The event name does not leak into the next event.
    assert decode([body + b"data: y\n\n"])[1] == (DATA, b"y")
    # An error event without data is still reported.
    assert decode([b"event: error\n\n"]) == [(ERROR_EVENT, b"")]
    assert decode([encode_event(b"x", event=b"error")]) == [(ERROR_EVENT, b"x")]


def test_event_name_rules():
    """The event name (spec): the last `event:` line of the block wins, wherever it stands;
    names are case-sensitive; one space after the colon is dropped, no more."""
    assert decode([b"event:error\ndata: x\n\n"]) == [(ERROR_EVENT, b"x")]
    assert decode([b"data: x\nevent: error\n\n"]) == [(ERROR_EVENT, b"x")]  # after the data line
    assert decode([b"event: error\nevent: message\ndata: x\n\n"]) == [(DATA, b"x")]
    assert decode([b"event: message\nevent: error\ndata: x\n\n"]) == [(ERROR_EVENT, b"x")]
    assert decode([b"event: Error\ndata: x\n\n"]) == [(DATA, b"x")]
    assert decode([b"event:  error\ndata: x\n\n"]) == [(DATA, b"x")]  # the name is " error"
    assert decode([b"event: error\n: ping\ndata: x\n\n"]) == [(COMMENT, b"ping"), (ERROR_EVENT, b"x")]
    # After a run of fast-path events in one read, and unterminated at EOF (flush).
    assert decode([b"data: a\n\ndata: b\n\nevent: error\ndata: c\n\ndata: d\n\n"]) == [
        (DATA, b"a"), (DATA, b"b"), (ERROR_EVENT, b"c"), (DATA, b"d")]
    assert decode([b"data: a\n\nevent: error\ndata: gone"]) == [(DATA, b"a"), (ERROR_EVENT, b"gone")]
    assert decode([b"event: error"]) == [(ERROR_EVENT, b"")]


@settings(max_examples=300)
@given(
    evs=st.lists(st.tuples(st.sampled_from([None, b"error", b"message", b"Error", b"errors", b"ping"]),
                           payloads), max_size=10),
    name_last=st.lists(st.booleans(), min_size=1),
    eol=st.sampled_from(EOLS),
    cut=cuts,
)
def test_event_name_property(evs, name_last, eol, cut):
    """Any event names, the `event:` line before or after the data, any read boundaries: exactly
    the events named `error` come back as ERROR_EVENT, every other one as DATA, payloads intact."""
    wire = b""
    for i, (name, payload) in enumerate(evs):
        data = eol.join(b"data: " + line for line in payload.split(b"\n"))
        if name is None:
            block = data
        elif name_last[i % len(name_last)]:
            block = data + eol + b"event: " + name
        else:
            block = b"event: " + name + eol + data
        wire += block + eol + eol
    expected = [(ERROR_EVENT if name == b"error" else DATA, payload) for name, payload in evs]
    assert decode(split_at(wire, cut)) == expected
    assert decode([wire]) == expected


def test_flush_unterminated_event():
    d = SSEDecoder()
    assert d.feed(b"data: a\n\ndata: tail") == [(DATA, b"a")]
    assert d.flush() == [(DATA, b"tail")]
    assert d.flush() == []
    d = SSEDecoder()
    assert d.feed(b"data: tail\r\n") == []
    assert d.flush() == [(DATA, b"tail")]
    d = SSEDecoder()
    d.feed(b"data: x\r")
    assert d.flush() == [(DATA, b"x")]
    assert d.feed(b"\ndata: y\n\n") == [(DATA, b"y")]  # the pending \r is forgotten on flush


def test_blank_line_runs_and_leading_blank_lines():
    assert decode([b"\n\n\ndata: a\n\n\n\n\ndata: b\n\n\n"]) == [(DATA, b"a"), (DATA, b"b")]


def test_bom_skipped_even_when_split():
    assert decode([b"\xef", b"\xbb", b"\xbfdata: a\n\n"]) == [(DATA, b"a")]
    assert decode([b"\xef\xbb\xbfdata: a\n\n"]) == [(DATA, b"a")]
    # A BOM-like prefix that is not a BOM is kept as content (a garbage field name here).
    assert decode([b"\xef", b"data: a\n\ndata: b\n\n"]) == [(DATA, b"b")]


def test_large_event_in_many_small_feeds():
    payload = b"x" * 100_000
    stream = encode_event(payload)
    pieces = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    d = SSEDecoder()
    out = []
    for p in pieces:
        out.extend(d.feed(p))
    assert out == [(DATA, payload)]
    assert d.bytes_fed == len(stream)


def test_empty_feed_keeps_pending_cr():
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []
    assert d.feed(b"") == []
    assert d.feed(b"\n\n") == [(DATA, b"a")]


def test_encoders():
    assert encode_event(b"{}") == b"data: {}\n\n"
    assert encode_event(b"a\nb", eol=b"\r\n") == b"data: a\r\ndata: b\r\n\r\n"
    assert encode_event(b"e", event=b"error") == b"event: error\ndata: e\n\n"
    assert encode_comment(b"ping") == b": ping\n\n"
    assert encode_comment() == b": \n\n"
    with pytest.raises(ValueError):
        encode_event(b"a\rb")
    with pytest.raises(ValueError):
        encode_comment(b"a\nb")


def test_repr_shows_state():
    d = SSEDecoder()
    d.feed(b"data: abc")
    assert repr(d) == "SSEDecoder(bytes_fed=9, events=0, comments=0, pending_bytes=9)"
