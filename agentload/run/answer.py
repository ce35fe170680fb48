"""What an answer was: ok, or the error class and one-line message that say why not.

The verdict fails closed: a response is `ok` only if it is what was asked for. Error classes
(`Result.error`) besides `http_<status>` and the exception classes of `request.classify_exception`:

- `not_a_stream`: a stream was asked for (`"stream": true` in the body), the answer is 2xx but
  its Content-Type is not `text/event-stream` (an HTML login page, a JSON object).
- `bad_response`: a non-streamed 2xx body that is not the API's answer object (not JSON,
  no choices, no message).
- `inband_error`: an error object in the body or the stream, or an SSE `event: error`.
- `malformed_stream`: the stream had malformed events (not JSON, not an object, wrong-shaped
  fields) and neither a token nor a finish_reason.
- `empty_stream`: the stream ended ([DONE] or EOF) with no malformed event, no token and no
  finish_reason (an answer that finished empty, with a finish_reason, is ok).
- `incomplete_stream`: tokens came, then the stream ended with neither finish_reason nor [DONE].
- `no_finish_reason`: tokens came, then [DONE], but no finish_reason: an answer cut short.
- `content_encoding`: a 2xx body in a `Content-Encoding` agentload cannot decode (it asks for
  identity; gzip and deflate sent anyway are decoded by aiohttp's parser, on either request path):
  one aiohttp does not know (`x-snappy`, `gzip, br`), or br/zstd without their package. The
  message names the encoding.

Messages and Responses streams (`apis`) end with their terminal event (`message_stop`,
`response.completed`): without it a stream is `incomplete_stream` (tokens came) or `empty_stream`;
`event: error`, `response.failed` and `response.incomplete` are `inband_error`s.

Tool calls that cannot be sent back as they came are not an error class, in any API: the answer
is `ok` and its record names them (`tool_call_problems`, read by `agent`); in mode model that
conversation ends there, and the verdict says `malformed_tool_calls` or `truncated`.

Each message is one line naming what came back (status, Content-Type, first bytes, or what
the stream carried).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentload import redact
from agentload.records import Trace
from agentload.run.apis.reader import AnswerReader

_FIRST_BYTES = 120  # bytes of an unexpected body quoted in the error message


def first_bytes(raw: bytes, limit: int = _FIRST_BYTES) -> str:
    """The first `limit` bytes of a body as one line of text (for error messages)."""
    if not raw:
        return "(empty body)"
    text = redact.redact(raw[:4 * limit].decode("utf-8", "replace"))[:limit]
    text = text.replace("\r", " ").replace("\n", " ").replace("\t", " ")
    return text + ("..." if len(raw) > limit else "")


def content_encoding_error(enc: str, status: int | None, ctype: str, why: str = "") -> Result:
    """The answer of a body in an encoding agentload cannot decode (see `content_encoding`)."""
    came = f"{what_came(status, ctype)} " if status is not None else "an answer "
    return Result(status, None, "content_encoding",
                  f"{came}with Content-Encoding: {enc}, which agentload cannot decode (it asked for identity; "
                  f"it decodes gzip and deflate){f': {why}' if why else ''}")


def what_came(status: int, ctype: str) -> str:
    return f"HTTP {status} {ctype}" if ctype else f"HTTP {status} (no Content-Type)"


def stream_verdict(cs: AnswerReader, trace: Trace) -> tuple[str | None, str | None]:
    """The error class and message of a stream that was read to its end (None, None: ok).

    A stream of another API (`apis`) names its own terminal event (`END`: message_stop,
    response.completed) and must end with it."""
    if cs.error is not None:
        return "inband_error", cs.error
    end_event = cs.END
    if end_event is not None:
        return _api_stream_verdict(cs, trace, end_event)
    if cs.token_chunks == 0 and cs.finish_reason is None:
        end = "with [DONE]" if cs.done else "at EOF"
        if cs.bad_json:
            return "malformed_stream", (
                f"stream ended {end} after {cs.bad_json} malformed event(s) of {cs.chunks - cs.dones}: no token, "
                f"no finish_reason; first malformed event: {first_bytes(cs.first_bad or b'')}")
        return "empty_stream", f"stream ended {end}{_arrived(cs, trace)}: no token, no finish_reason"
    if cs.finish_reason is None:
        if not cs.done:
            return "incomplete_stream", "stream ended without finish_reason or [DONE]"
        # tokens, then [DONE] with no finish_reason: an answer cut short (llama-cpp-python's
        # interrupt_requests does this after some tokens), not one that said how it ended
        return "no_finish_reason", (f"stream ended with [DONE] after {cs.token_chunks} token chunk(s) but no "
                                    f"finish_reason: the answer may have been cut short")
    return None, None


def _api_stream_verdict(cs: AnswerReader, trace: Trace, end_event: str) -> tuple[str | None, str | None]:
    """`_stream_verdict` for a stream whose API has a terminal event (Messages, Responses)."""
    end = f"with {end_event}" if cs.done else "at EOF"
    if cs.token_chunks == 0 and (cs.finish_reason is None or not cs.done):
        if cs.bad_json:
            return "malformed_stream", (
                f"stream ended {end} after {cs.bad_json} malformed event(s) of {cs.chunks}: no output; "
                f"first malformed event: {first_bytes(cs.first_bad or b'')}")
        if not cs.done or cs.finish_reason is None:
            what = (f"{cs.chunks} event(s) without output" if cs.chunks else
                    (f"{trace.bytes_in} byte(s) and no event" if trace.bytes_in else "an empty body"))
            comments = f" and {trace.comments} comment(s)" if trace.comments else ""
            return "empty_stream", f"stream ended {end} after {what}{comments}: no output, no {cs.FINISH}"
    if not cs.done:
        return "incomplete_stream", (f"stream ended without {end_event} after {cs.token_chunks} output event(s): "
                                     f"the answer was cut short")
    if cs.finish_reason is None:
        return "no_finish_reason", (f"stream ended with {end_event} after {cs.token_chunks} output event(s) but no "
                                    f"{cs.FINISH}: the answer may have been cut short")
    return None, None


def _arrived(cs: AnswerReader, trace: Trace) -> str:
    """What an empty stream carried (it had no token, no finish_reason, no malformed event)."""
    parts = []
    with_choices = cs.chunks - cs.dones - cs.no_choices  # each had choices but nothing in them
    if with_choices:
        parts.append(f"{with_choices} role-only/empty chunk(s)")
    if cs.no_choices:
        parts.append(f"{cs.no_choices} chunk(s) without choices" + (" (usage)" if cs.usage else ""))
    if trace.comments:
        parts.append(f"{trace.comments} comment(s)")
    if parts:
        return " after " + ", ".join(parts)
    if cs.done:
        return " and nothing before it"
    return f" after {trace.bytes_in} byte(s) and no event" if trace.bytes_in else " with an empty body"


@dataclass(slots=True)
class Result:
    status: int | None
    stream: AnswerReader | None
    error: str | None  # error class; None when the request completed
    error_msg: str | None
    retry_after_s: float | None = None
    protocol: list[str] | None = None  # `protocol_notes`: what the stream did wrong around its [DONE]


AFTER_DONE = "events_after_done"
HELD_OPEN = "held_open_after_done"


def protocol_notes(cs: AnswerReader, held_open: bool, grace_s: float) -> list[str]:
    """What a stream that was read did against the protocol without keeping its answer from being
    read, one `code: detail` line each (the record's `protocol`): data events after its [DONE]
    (`events_after_done`: never part of the answer, which an SDK client ends at [DONE]), a body
    the server held open past its [DONE] (`held_open_after_done`: ended by agentload)."""
    out = []
    end = cs.END or "[DONE]"  # (Messages, Responses: their terminal event)
    if cs.after_done:
        out.append(f"{AFTER_DONE}: {cs.after_done} data event(s) after [DONE], {cs.after_done_tokens} with tokens "
                   f"(not counted: the answer ends at [DONE]); first: {first_bytes(cs.first_after_done or b'')}")
    if held_open:
        out.append(f"{HELD_OPEN}: the body was still open {grace_s:g} s after {end}; agentload ended the "
                   f"read there and closed the connection")
    return out



def whole_verdict(cs: AnswerReader, status: int, ctype: str, raw: bytes) -> Result:
    """The answer of a non-streamed 2xx body (`cs`: the API's reader of it, `from_response`)."""
    if cs.error is not None:
        return Result(status, cs, "inband_error", cs.error)
    if cs.not_completion is not None:
        return Result(status, cs, "bad_response", f"{what_came(status, ctype)}, not a {cs.OBJECT} object "
                                                  f"({cs.not_completion}): {first_bytes(raw)}")
    return Result(status, cs, None, None)
