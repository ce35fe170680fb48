"""The tool calls of one answer, assembled from the pieces each API streams, and the one check of
whether they can be sent back as they came.

Every API streams a tool call as an opening (its id and name) and then its arguments in pieces:

- chat: `tool_calls[i]` fragments joined by `index` (`merge_chat`): `id`, `type` and
  `function.name` from the first non-null value seen for that index (later values ignored),
  `function.arguments` fragments concatenated as received. Explicit nulls (SGLang) and empty ids
  are ignored. A fragment without an `index` (non-conforming servers) continues the last call,
  unless it carries an id different from the last call's, which starts a new call.
- Messages: a `tool_use` content block opens a call at its block index (`open`), with its
  `input` whole (what the call is when no delta follows); `input_json_delta`s carry the arguments
  (`add_arguments`).
- Responses: a `function_call` output item opens a call at its `output_index` (`open`);
  `response.function_call_arguments.delta`s carry the arguments (`add_arguments`); the `.done`
  events give them whole (`whole_arguments`), which must be what the deltas joined to.

`problems` says, once the answer is read, why its tool calls cannot be sent back as they came (a
real agent would have to invent or repair something), one `code: detail` line each, in the codes
of `agentload.records.record`: a call without an id or a name, arguments that are not a JSON object
(not JSON, cut mid-JSON, an object sent instead of a string), a second id on an index another call
had (two calls a client would merge), and an answer cut by max_tokens (finish_reason `length`, in
chat's words whatever the API) that carried a tool call or was asked for one. What only the stream
shows (a second id on an index, arguments sent as an object, deltas that differ from the whole
arguments) is noted while it is read (`odd`).
"""

from __future__ import annotations

from typing import Any

import orjson

from agentload.records.record import (
    BAD_ARGUMENTS,
    IDS_ON_ONE_INDEX,
    NO_ID,
    NO_NAME,
    TRUNCATED,
)

_MAX_PROBLEMS = 8  # tool-call problems kept per answer
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError

# A call: [id, type, name, [argument pieces], whole arguments or None] (a list: the chat reader's
# shaped path appends to its pieces directly).
ID, TYPE, NAME, PIECES, WHOLE = range(5)


class ToolCalls:
    """The tool calls of one answer by index; see the module docstring."""

    __slots__ = ("calls", "last_index", "odd_lines")

    def __init__(self) -> None:
        self.calls: dict[int, list] = {}
        self.last_index: int | None = None  # (chat) the call a fragment without an index continues
        self.odd_lines: list[str] | None = None  # what the stream did that no call should

    def __bool__(self) -> bool:
        return bool(self.calls)

    def __len__(self) -> int:
        return len(self.calls)

    # ------------------------------------------------------------------ assembling

    def open(self, idx: int, cid: Any, name: Any, whole: str | None = None) -> list:
        """A call opens at `idx` (Messages' tool_use block, Responses' function_call item) with its
        id, its name and, where the API gives them there, its arguments whole. A second opening on
        an index taken by a call with another id is noted, and joined to that call, as chat's are."""
        call = self.calls.get(idx)
        if call is None:
            call = self.calls[idx] = [cid or None, None, name or None, [], whole]
            return call
        self._same_call(call, idx, cid)
        call[NAME] = call[NAME] or name or None
        if call[WHOLE] is None:
            call[WHOLE] = whole
        return call

    def add_arguments(self, idx: int, piece: str) -> None:
        """A piece of the arguments of the call at `idx` (KeyError: no call opened there)."""
        self.calls[idx][PIECES].append(piece)

    def whole_arguments(self, idx: int, args: str) -> None:
        """The arguments of the call at `idx` given whole (Responses' done events): what its pieces
        must have joined to."""
        call = self.calls[idx]
        pieces = call[PIECES]
        if pieces:
            joined = "".join(pieces)
            pieces[:] = [joined]
            if joined != args:
                self.odd(f"{BAD_ARGUMENTS}: index {idx}'s argument deltas joined ({len(joined)} chars) differ from "
                         f"the arguments it then gave whole ({len(args)} chars): {_sample(args)}")
        call[WHOLE] = args

    def merge_chat(self, frags: Any) -> bool:
        """Merge chat's `tool_calls` fragments; True if any carried a name or arguments text."""
        token = False
        calls = self.calls
        for f in frags:
            if type(f) is not dict:
                continue
            idx = f.get("index")
            fid = f.get("id")
            if type(idx) is not int:
                # Non-conforming server without index: continue the last call unless
                # this fragment opens a new one (a different id).
                last = self.last_index
                if last is None or (fid and calls[last][ID] is not None and calls[last][ID] != fid):
                    idx = 0 if last is None else max(calls) + 1
                else:
                    idx = last
            call = calls.get(idx)
            if call is None:
                call = calls[idx] = [None, None, None, [], None]
            self.last_index = idx
            if fid:
                self._same_call(call, idx, fid)
            ftype = f.get("type")
            if ftype is not None and call[TYPE] is None:
                call[TYPE] = ftype
            fn = f.get("function")
            if fn:
                token = self._merge_function(call, idx, fn) or token
        return token

    def _merge_function(self, call: list, idx: int, fn: Any) -> bool:
        """A chat fragment's `function` (AttributeError: not an object); True if it carried text."""
        token = False
        name = fn.get("name")
        if name:
            if call[NAME] is None:
                call[NAME] = name
            token = True
        args = fn.get("arguments")
        if args:
            if type(args) is not str:  # non-conforming: an object, not a string
                self.odd(f"{BAD_ARGUMENTS}: index {idx} sent its arguments as a JSON {_json_type(args)}, "
                         f"not a string")
                args = orjson.dumps(args).decode()
            call[PIECES].append(args)
            token = True
        return token

    def _same_call(self, call: list, idx: int, cid: Any) -> None:
        """`cid` came for the call at `idx`: its id if it had none; a second id is noted."""
        if not cid:
            return
        if call[ID] is None:
            call[ID] = cid
        elif cid != call[ID]:  # a second call on a taken index: joined into one
            self.odd(f"{IDS_ON_ONE_INDEX}: index {idx} carried the ids {_sample(str(call[ID]))} and "
                     f"{_sample(str(cid))}: two calls that would be merged into one")

    def odd(self, line: str) -> None:
        odd = self.odd_lines
        if odd is None:
            self.odd_lines = [line]
        elif len(odd) < _MAX_PROBLEMS and line not in odd:
            odd.append(line)

    # ------------------------------------------------------------------ results

    def as_list(self) -> list[dict]:
        """Joined tool calls in index order: ``{"id","type","function":{"name","arguments"}}``.

        ``type`` defaults to ``"function"`` if the server never sent one; ``id`` and ``name`` are
        None if never sent (the caller decides what to do about that). An index that only ever
        received nulls and empty strings is not a call and is skipped."""
        out = []
        calls = self.calls
        for idx in sorted(calls):
            cid, ctype, name, pieces, whole = calls[idx]
            if cid is None and name is None and not pieces and whole is None:
                continue  # an empty fragment (only index/type/nulls) is not a call
            if len(pieces) > 1:
                pieces[:] = ["".join(pieces)]
            args = pieces[0] if pieces else (whole if whole is not None else "")
            out.append({"id": cid, "type": ctype or "function", "function": {"name": name, "arguments": args}})
        return out

    def problems(self, finish_reason: str | None, token_chunks: int, usage: dict | None, expected: bool = False,
                 max_tokens: int | None = None) -> list[str] | None:
        """Why these tool calls cannot be sent back as they came, one `code: detail` line each (the
        record's `tool_call_problems`); None when nothing is wrong. `expected`: a tool call was asked
        for (`tool_choice` "required" or a tool's name), so an answer cut by max_tokens is truncated
        even without one. Codes: `truncated` (finish_reason length on an answer that carried a tool
        call or was asked for one; or arguments cut mid-JSON once the answer's tokens reached
        `max_tokens`, whatever finish_reason said: llama-cpp-python says "tool_calls" for a named tool
        however it ended), `bad_arguments`, `no_id`, `no_name`, `ids_on_one_index`."""
        if not self.calls and not (expected and finish_reason == "length"):
            return None
        calls = self.as_list() if self.calls else []
        out, cut = _call_problems(calls)
        if self.odd_lines:
            out.extend(self.odd_lines)
        n = len(calls)
        if finish_reason == "length" and (calls or expected):
            what = (f"{n} tool call(s), the arguments of {cut} cut mid-JSON" if cut else
                    f"{n} tool call(s) with whole arguments" if n else "no tool call, though one was asked for")
            out.insert(0, f"{TRUNCATED}: finish_reason length after {token_chunks} token chunk(s): {what}")
        elif cut and max_tokens:
            u = usage.get("completion_tokens") if usage else None
            used, unit = (u, "completion_tokens") if type(u) is int else (token_chunks, "token chunk(s)")
            if used >= max_tokens:
                out.insert(0, f"{TRUNCATED}: finish_reason {finish_reason} but {used} {unit}, max_tokens "
                              f"{max_tokens}: {n} tool call(s), the arguments of {cut} cut mid-JSON")
        return out[:_MAX_PROBLEMS] or None


def _call_problems(calls: list[dict]) -> tuple[list[str], int]:
    """Each call's own problems (no id, no name, arguments not a JSON object), and how many had
    arguments that are not JSON at all (cut mid-JSON, if the answer was cut)."""
    out: list[str] = []
    cut = 0
    for i, c in enumerate(calls):
        fn = c["function"]
        name = fn["name"]
        who = f"call {i} ({name})" if name else f"call {i}"
        if not c["id"]:
            out.append(f"{NO_ID}: {who} came without an id (a tool result cannot name it)")
        if not name:
            out.append(f"{NO_NAME}: {who} came without a function name")
        args = fn["arguments"]
        try:
            obj = _loads(args)
        except _JSONDecodeError:
            cut += 1
            out.append(f"{BAD_ARGUMENTS}: {who} arguments are not JSON ({len(args)} chars): {_sample(args)}")
            continue
        if type(obj) is not dict:
            out.append(f"{BAD_ARGUMENTS}: {who} arguments are a JSON {_json_type(obj)}, not an object: "
                       f"{_sample(args)}")
    return out, cut


def _sample(text: str, n: int = 60) -> str:
    """A short quote of what the server sent."""
    q = orjson.dumps(text[:n]).decode()
    return q + ("..." if len(text) > n else "")


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(v), "number")
