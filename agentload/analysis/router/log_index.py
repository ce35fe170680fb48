"""The backend logs as an index: per line a 64-bit hash of the request id, the backend and the
arrival (20 bytes a line in numpy arrays, no Python object per line), so the router pass can ask
which backend got a record's request id without keeping the logs."""

from __future__ import annotations

import hashlib
from array import array

import numpy as np
import numpy.typing as npt

MAX_RETRY_EXAMPLES = 5


def id_hash(s: str) -> int:
    """A request id as 64 bits (stable across processes, unlike hash(): the reports are rebuilt
    byte for byte)."""
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


class LogIndex:
    """Every backend log line as (hash of its id, backend, arrival), per role, sorted by id then
    arrival: which backend(s) of a role got a request id, in numpy arrays (20 bytes a line)."""

    def __init__(self) -> None:
        self._raw: dict[str, tuple[array[int], array[int], array[int]]] = {}
        self.h: dict[str, npt.NDArray[np.uint64]] = {}
        self.b: dict[str, npt.NDArray[np.int32]] = {}
        self.t: dict[str, npt.NDArray[np.int64]] = {}

    def add(self, role: str, h: int, backend: int, recv: int) -> None:
        raw = self._raw.get(role)
        if raw is None:
            raw = self._raw[role] = (array("Q"), array("i"), array("q"))
        raw[0].append(h)
        raw[1].append(backend)
        raw[2].append(recv)

    def freeze(self) -> "LogIndex":
        for role, (h, b, t) in self._raw.items():
            ha = np.frombuffer(h, dtype=np.uint64) if len(h) else np.zeros(0, np.uint64)
            ba = np.frombuffer(b, dtype=np.int32) if len(b) else np.zeros(0, np.int32)
            ta = np.frombuffer(t, dtype=np.int64) if len(t) else np.zeros(0, np.int64)
            order = np.lexsort((ta, ha))
            self.h[role], self.b[role], self.t[role] = ha[order], ba[order], ta[order]
        self._raw = {}
        return self

    def __bool__(self) -> bool:
        return any(len(h) for h in self.h.values())

    def latest(self, role: str, h: int) -> int | None:
        """The backend whose log has the latest arrival of this id among the role's backends."""
        hs = self.h.get(role)
        if hs is None or not len(hs):
            return None
        key = np.uint64(h)
        i = int(np.searchsorted(hs, key, side="right")) - 1
        if i >= 0 and hs[i] == key:
            return int(self.b[role][i])
        return None

    def first(self, role: str, h: int) -> tuple[int, int] | None:
        """(backend, arrival) of the earliest arrival of this id among the role's backends (a line
        without an arrival stamp counts as none)."""
        hs = self.h.get(role)
        if hs is None or not len(hs):
            return None
        key = np.uint64(h)
        lo = int(np.searchsorted(hs, key, side="left"))
        hi = int(np.searchsorted(hs, key, side="right"))
        for i in range(lo, hi):
            if int(self.t[role][i]) > 0:
                return int(self.b[role][i]), int(self.t[role][i])
        return None

    def repeats(self, role: str) -> tuple[int, int, list[int]]:
        """(ids at 2+ backends of the role, ids twice or more at one backend, the first hashes of
        the former): a router's retries, across backends and on the same one."""
        hs = self.h.get(role)
        if hs is None or len(hs) < 2:
            return 0, 0, []
        bs = self.b[role]
        order = np.lexsort((bs, hs))
        h2, b2 = hs[order], bs[order]
        same_id = h2[1:] == h2[:-1]
        other = same_id & (b2[1:] != b2[:-1])
        same = same_id & (b2[1:] == b2[:-1])
        across = np.unique(h2[1:][other])
        again = np.unique(h2[1:][same])
        return int(len(across)), int(len(again)), [int(x) for x in across[:MAX_RETRY_EXAMPLES]]
