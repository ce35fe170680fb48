"""locust as a peer of the benchmark (bench/peers.py): a closed loop of streamed chat completions.

Each locust user (FastHttpUser, geventhttpclient) sends a streaming chat completion, reads the
SSE body to the end in 1 KiB reads (`iter_content(1024)`, as locust's own `iter_lines` does:
geventhttpclient's read waits for that many bytes or the end), splits the events and parses
every data payload with `json`
(what a client that counts tokens must do at least, like bench/baseline.py --parse json), then
sends the next one at once (no wait time). With `-u N` that is N streams in flight. The whole
run stops after BENCH_REQUESTS requests (sent by all users together).

    locust -f bench/locustfile.py --headless -u 64 -r 10000 -H http://127.0.0.1:PORT --only-summary
    (environment: BENCH_REQUESTS=2560 BENCH_BODY_BYTES=3000)

Runs in locust's own environment (bench/peers.py makes one); imports nothing of agentload.
"""

from __future__ import annotations

import json
import os

import gevent
from locust import FastHttpUser, constant, task
from locust.exception import StopUser

LIMIT = int(os.environ.get("BENCH_REQUESTS", "1000"))
BODY_BYTES = int(os.environ.get("BENCH_BODY_BYTES", "2000"))
PATH = "/v1/chat/completions"


def body_of(size: int) -> bytes:
    """A chat request of about `size` bytes, as bench/baseline.py builds it."""
    base = {"model": "bench", "max_tokens": 32, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": ""}, {"role": "user", "content": "hello"}]}
    pad = max(0, size - len(json.dumps(base, separators=(",", ":"))))
    base["messages"][0]["content"] = ("lorem ipsum " * (pad // 12 + 1))[:pad]
    return json.dumps(base, separators=(",", ":")).encode()


BODY = body_of(BODY_BYTES)
HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
counts = {"sent": 0, "done": 0, "chunks": 0}


class StreamingChat(FastHttpUser):
    wait_time = constant(0)
    connection_timeout = 10.0
    network_timeout = 60.0

    @task
    def chat(self) -> None:
        if counts["sent"] >= LIMIT:
            raise StopUser()
        counts["sent"] += 1
        with self.client.post(PATH, data=BODY, headers=HEADERS, stream=True, catch_response=True,
                              name="chat") as resp:
            chunks = 0
            content = False
            rest = b""
            for data in resp.iter_content(chunk_size=1024, decode_content=False):
                events = (rest + data).split(b"\n\n")
                rest = events.pop()
                for ev in events:
                    if not ev.startswith(b"data: "):
                        continue
                    chunks += 1
                    payload = ev[6:]
                    if payload == b"[DONE]":
                        continue
                    obj = json.loads(payload)
                    choices = obj.get("choices")
                    if choices and (choices[0].get("delta") or {}).get("content"):
                        content = True
            if content:
                resp.success()
            else:
                resp.failure("no content in the stream")
        counts["done"] += 1
        counts["chunks"] += chunks
        if counts["done"] >= LIMIT:
            gevent.spawn(self.environment.runner.quit)
