"""A request's body as it goes out: a conversation's bytes, asked for when they are written.

`ConversationBody` is aiohttp's payload of a conversation's request (the transport may park it,
compressed, while the request waits for a pool connection); `body_bytes` gives the bytes of either
kind of body; `wants_stream` reads whether a body asks for a stream without parsing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp.payload
from multidict import CIMultiDict

if TYPE_CHECKING:
    from agentload.run.conversation import Conversation

_STREAM_KEY = b'"stream":'


def wants_stream(body: bytes) -> bool:
    """Does this request body ask for a stream (`"stream": true`)?

    The first `"stream":` in a JSON body is the top-level key: a string cannot hold an unescaped
    quote, and agentload's bodies put `stream` before `tools` and `messages`. One scan that stops
    near the start of the body; no parse.
    """
    i = body.find(_STREAM_KEY)
    if i < 0:
        return False
    return body[i + 9:i + 24].lstrip()[:4] == b"true"


class ConversationBody(aiohttp.payload.Payload):
    """A conversation's request body as aiohttp's payload: the bytes are asked of the
    conversation when they are written, so while the request waits for a pool connection the
    conversation alone holds them, and can keep them compressed (`park`, called by the
    transport when many bodies are queued). Nothing else on the send path holds the bytes.

    Payload's own __init__ (content type guessing, a header map per request) is not run: the
    headers are one shared map, and the size is the body's length."""

    _autoclose = True  # no file or socket behind it

    def __init__(self, conv: "Conversation"):  # (Payload.__init__ not called: see above)
        self._value = conv
        self._size = self._nbytes = len(conv.body())
        self._encoding = None
        self._filename = None
        self._headers = _JSON_HEADERS

    @property
    def size(self) -> int:
        return self._nbytes

    def raw(self) -> bytes:
        return self._value.body()

    def park(self) -> int:
        """Compress the waiting body; the bytes freed (0: already parked, or not whole)."""
        return self._value.park()

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self._value.body().decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self._value.body()

    async def write(self, writer) -> None:
        await writer.write(self._value.body())

    async def write_with_length(self, writer, content_length: int | None) -> None:
        body = self._value.body()
        await writer.write(body if content_length is None else body[:content_length])


_JSON_HEADERS = CIMultiDict({"Content-Type": "application/json"})


def body_bytes(body: "bytes | ConversationBody") -> bytes:
    return body if isinstance(body, bytes) else body.raw()

