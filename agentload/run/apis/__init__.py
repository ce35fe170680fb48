"""The APIs agents speak: one module each, behind one small interface.

`[target] api` picks one: "chat" (OpenAI's Chat Completions), "messages" (Anthropic's Messages:
what Claude Code sends), "responses" (OpenAI's Responses: what Codex and the Agents SDK send).
The conversation is the same seeded one whatever the API (kept in chat's form: the agent's
rounds, tokens and message counts do not depend on the API); each module turns it into its own
request and reads its own stream into the same fields (`Stream`), so phases, records, the
verdict and the reports stay API-blind.

A module gives:

- (the path after the endpoint, `/chat/completions`, `/messages`, `/responses`, is
  `agentload.endpoint.API_PATHS`'s: `api_url` joins it onto the endpoint)
- `head(cfg, model, tools) -> dict`: the request's fields that are the same every round (the
  settings, the tools in the API's form); `SYSTEM`: the key the system prompt goes under (None:
  it is the first message, as in chat); `ITEMS`: the key of the growing list.
- `encode(messages) -> list[bytes]`: chat-form messages (a batch appended together: the tool
  results of one round) as the API's list items, each serialised once.
- `headers(key) -> dict`: the API's own headers, with the API key if one is set.
- `Stream`: the accumulator of one answer (see `agentload.run.chat_stream.ChatStream`, whose
  interface every `Stream` has): `add`/`add_many` per data event, `add_error_event`,
  `from_response` for a non-streamed body, and the same counts, `finish_reason` (chat's words:
  stop, length, tool_calls), `usage` (chat's keys: prompt_tokens, completion_tokens,
  prompt_tokens_details.cached_tokens), `first_kind` (text, tool or reasoning: which output came
  first), `assistant_message()` in chat's form.
"""

from __future__ import annotations

from types import ModuleType

from agentload.endpoint import API_PATHS

API_NAMES = tuple(API_PATHS)


def get(api: str) -> ModuleType:
    """The module of `api` ("chat", "messages" or "responses")."""
    if api == "chat":
        from agentload.run.apis import chat as m
    elif api == "messages":
        from agentload.run.apis import messages as m  # type: ignore[no-redef]
    elif api == "responses":
        from agentload.run.apis import responses as m  # type: ignore[no-redef]
    else:
        raise ValueError(f"unknown api {api!r}; expected one of {', '.join(API_NAMES)}")
    return m
