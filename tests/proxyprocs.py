"""nginx and haproxy (Debian's packages; .ci/run installs them) started by the tests on loopback in
front of a mock, each with its own config file in a temporary directory: no system service, no pid
file in /run, no log outside that directory.

    with NginxProcess.start(mock.base, tmp_path / "nginx", "proxy_read_timeout 3s;") as nx:
        ... --set target.endpoint="{nx.url}" ...

`location` is what goes into nginx's `location /` block besides `proxy_pass` (nginx's defaults when
empty: `proxy_buffering on`, HTTP/1.0 upstream); `http` goes into its `http` block (a
`limit_conn_zone`). haproxy takes its `defaults` timeouts and any backend lines the same way.
Readiness: GET /v1/models through the proxy answers 200 (the mock behind it answers).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from agentload.process import Listening, log_tail, start_listening
from serverprocs import Server

READY_TIMEOUT_S = 15.0


def proxy_executable(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}",) if os.access(p, os.X_OK)), None)


def proxy_skip_reason(*names: str) -> str | None:
    """Skip only when a proxy is missing AND `CI` is unset (in CI a missing one is a failure:
    .ci/run installs it)."""
    missing = [n for n in names if proxy_executable(n) is None]
    if not missing or os.environ.get("CI"):
        return None
    return f"{', '.join(missing)} missing (apt-get install -y {' '.join(missing)}; .ci/run installs them)"


class _Proxy(Server):
    NAME = "proxy"
    STOP_GRACE_S = 3.0  # SIGTERM first: its workers go with it

    def __init__(self, started: Listening, workdir: Path):
        super().__init__(started)
        self.workdir = workdir

    @classmethod
    def argv(cls, exe: str, workdir: Path, conf: Path) -> list[str]:
        raise TypeError(f"{cls.__name__} must say its command line")

    @classmethod
    def config(cls, workdir: Path, port: int, upstream: str, **kw: str) -> str:
        raise TypeError(f"{cls.__name__} must say its config")

    @classmethod
    def _start(cls, upstream: str, workdir: Path, **kw: str) -> "_Proxy":
        exe = proxy_executable(cls.NAME)
        if exe is None:
            raise FileNotFoundError(f"{cls.NAME} not found (apt-get install -y {cls.NAME}; .ci/run installs it)")
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / f"{cls.NAME}.conf"

        def command(ports: tuple[int, ...]) -> list[str]:
            conf.write_text(cls.config(workdir, ports[0], upstream.rstrip("/"), **kw))
            return cls.argv(exe, workdir, conf)

        return cls(start_listening(command, lambda ports: [f"http://127.0.0.1:{ports[0]}/v1/models"], name=cls.NAME,
                                   log_path=workdir / "stderr.log", timeout_s=READY_TIMEOUT_S, cwd=workdir,
                                   describe_log=lambda: _logs(workdir)), workdir)

    def log_tail(self, limit: int = 3000) -> str:
        return _logs(self.workdir, limit)


def _logs(workdir: Path, limit: int = 3000) -> str:
    """The tails of the proxy's logs (its stderr, nginx's error and access logs)."""
    return "\n".join(f"{f.name}: {log_tail(f, limit)}" for f in sorted(workdir.glob("*.log")))


class NginxProcess(_Proxy):
    """`nginx -p DIR -c nginx.conf -g 'daemon off; pid DIR/nginx.pid;'`: one worker, logs and temp
    files in DIR, `location /` proxying to the upstream."""

    NAME = "nginx"

    @classmethod
    def argv(cls, exe: str, workdir: Path, conf: Path) -> list[str]:
        return [exe, "-p", str(workdir), "-c", str(conf), "-e", str(workdir / "error.log"),
                "-g", f"daemon off; pid {workdir / 'nginx.pid'};"]

    @classmethod
    def config(cls, workdir: Path, port: int, upstream: str, location: str = "", http: str = "") -> str:
        w = workdir
        user = "user root;" if os.geteuid() == 0 else ""  # (as root, nginx's workers would be nobody's)
        return f"""{user}
worker_processes 1;
error_log {w}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log {w}/access.log;
    client_body_temp_path {w}/client_body;
    proxy_temp_path {w}/proxy_temp;
    fastcgi_temp_path {w}/fastcgi_temp;
    uwsgi_temp_path {w}/uwsgi_temp;
    scgi_temp_path {w}/scgi_temp;
    {http}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass {upstream};
            {location}
        }}
    }}
}}
"""

    @classmethod
    def start(cls, upstream: str, workdir: Path, location: str = "", http: str = "") -> "NginxProcess":
        return cls._start(upstream, workdir, location=location, http=http)  # type: ignore[return-value]


SSE_LOCATION = 'proxy_buffering off; proxy_http_version 1.1; proxy_set_header Connection "";'


class HaproxyProcess(_Proxy):
    """`haproxy -db -f haproxy.cfg`: in the foreground, no pid file, HTTP mode, one server."""

    NAME = "haproxy"

    @classmethod
    def argv(cls, exe: str, workdir: Path, conf: Path) -> list[str]:
        return [exe, "-db", "-f", str(conf)]

    @classmethod
    def config(cls, workdir: Path, port: int, upstream: str, timeouts: str = "", backend: str = "") -> str:
        host = upstream.split("://", 1)[-1].split("/", 1)[0]
        return f"""global
    maxconn 512
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    {timeouts}
frontend fe
    bind 127.0.0.1:{port}
    default_backend be
backend be
    {backend}
    server s1 {host}
"""

    @classmethod
    def start(cls, upstream: str, workdir: Path, timeouts: str = "", backend: str = "") -> "HaproxyProcess":
        return cls._start(upstream, workdir, timeouts=timeouts, backend=backend)  # type: ignore[return-value]
