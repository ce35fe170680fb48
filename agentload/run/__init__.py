"""The run path: scenario -> agents -> transport -> server, and the records it writes.

`scenario` (the validated model), `conversation`, `agent`, `transport` (the one aiohttp seam and
its trace stamps), `request` (one request) + `request_body` + `body_sink` + `sse` + `sse_body` (reading
a body) + `answer` (what the answer was), `apis` (each API's request and its reader, `chat_stream`
chat's; their tool calls in `apis.tool_calls`), `context`
(the run's shared state), `executor` (a run prepared once and the interface of what carries it
out), `runner` (the in-process executors: watchdog, canaries, samplers, shutdown), `arrivals`,
`observers`, `live`, `exporter`, `dump`, `health`, `scraper` (the target's metrics). Imports the
records layer, never analysis or report.
"""
