"""The one way agentload rewrites a whole file: readers see the old file or the new one, never half.

`write_atomic(path, data)` writes `data` to a temporary file in the same folder (so the rename
stays on one file system), optionally fsyncs it, and `os.replace`s it onto `path`. A failure
leaves `path` as it was and removes the temporary file. Used for run.json (rewritten as the run
goes), summary.json, report.txt, report.html and compare.json/txt/html. A leaf: imports nothing
of agentload.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

__all__ = ["write_atomic"]

_seq = itertools.count()


def write_atomic(path: str | os.PathLike[str], data: bytes, *, fsync: bool = False) -> Path:
    """Replace `path` with `data` in one step; returns the path.

    The temporary name is unique per process and call (`<name>.<pid>.<n>.tmp`), so two writers
    of one file never write into each other's temporary file. A file that is replaced keeps its
    permission bits; a new one gets the usual mode (0666 less the umask), as with open(). With
    `fsync`, the data reach the disk before the rename, and the folder after it.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{next(_seq)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        try:
            try:
                os.fchmod(fd, os.stat(path).st_mode & 0o7777)
            except FileNotFoundError:
                pass
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        _fsync_dir(path.parent)
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
