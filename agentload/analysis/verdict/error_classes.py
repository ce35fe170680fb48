"""The classes of request errors the rules sort failures by (the `error` a record carries)."""

from __future__ import annotations

from typing import Iterable, TypeGuard

from agentload.records import Record

# the other side closed the connection, mid-answer or on a stale keep-alive connection
DISCONNECT_ERRORS = {"ServerDisconnectedError", "ClientOSError", "ClientPayloadError",
                     "ClientConnectionResetError", "incomplete_stream", "ConnectionResetError"}
CONNECT_ERRORS = {"connect_timeout", "ClientConnectorError", "ClientConnectorDNSError", "ConnectionRefusedError",
                  "tls_certificate", "tls_handshake"}
# a request that ran out of time on agentload's side (aiohttp's total or read timeout)
TIMEOUT_ERRORS = {"total_timeout", "read_timeout", "ServerTimeoutError"}
# answers that came back but were not what the protocol says (see agentload.run.request)
PROTOCOL_ERRORS = {"not_a_stream", "bad_response", "malformed_stream", "empty_stream", "no_finish_reason",
                   "bad_tool_call", "content_encoding"}


def is_server_error(error: str | None) -> TypeGuard[str]:
    """An HTTP error status or an in-band error event: the server (or a layer in front) answered with an error."""
    return error is not None and (error.startswith("http_") or error == "inband_error")


def is_failed_reuse(r: Record) -> bool:
    """A request on a reused keep-alive connection that the other side closed before any answer
    (response headers): the POST is lost, and aiohttp does not retry it."""
    return r.outcome == "error" and r.reused is True and r.error in DISCONNECT_ERRORS and "headers" not in r.t


def failed_reuses(errors: Iterable[Record]) -> list[Record]:
    return [r for r in errors if is_failed_reuse(r)]
