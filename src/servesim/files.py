"""The files a run reads and writes, handled so that no input can hang or exhaust the
process and no output can destroy what the run reads.

* :func:`read_bounded` - the one reader of whole input files (a config, a payload, a
  model's ``config.json``, a timing table): a regular file only (a device can be endless,
  a FIFO can block forever), read no further than a size limit.
* :func:`identity` - a file as the system knows it (device and inode), so that a hard
  link or a symbolic link to an input is recognised as that input.
* :func:`whole_file` - an output written to a temporary file beside it and renamed over it
  on success, so that the file is either complete or untouched.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from servesim import codes

MiB = 1024 * 1024
TEMP_PREFIX = ".servesim-"  # short: an output's name may take all 255 bytes a name allows


class Unreadable(Exception):
    """An input file that cannot be read; ``code`` is the diagnostic code to report."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def read_bounded(path: str | Path, what: str, limit: int) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes
    (``what`` names the expected content in messages: "a TOML file")."""
    try:
        # non-blocking: opening a FIFO without a writer returns at once (then is refused)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise Unreadable("file not found", codes.FILE_NOT_FOUND) from None
    except IsADirectoryError:
        raise Unreadable(f"is a directory, expected {what}", codes.FILE_UNREADABLE) from None
    except OSError as exc:  # a symbolic-link loop, no permission, a name too long
        raise Unreadable(f"cannot read: {exc.strerror or exc}", codes.FILE_UNREADABLE) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise Unreadable(f"is a directory, expected {what}", codes.FILE_UNREADABLE)
        if not stat.S_ISREG(mode):
            raise Unreadable(f"is not a regular file (a device, pipe or socket), expected "
                             f"{what}", codes.FILE_UNREADABLE)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise Unreadable(f"cannot read: {exc.strerror or exc}", codes.FILE_UNREADABLE) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Unreadable(f"file is over {limit} bytes, the most {what} may be",
                         codes.FILE_TOO_LARGE)
    return data


def identity(path: str | Path) -> tuple[int, int] | None:
    """``(device, inode)`` of the file ``path`` names (through symbolic links), or
    ``None`` when there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def is_special(path: str | Path) -> bool:
    """Whether ``path`` names an existing file that is not a regular file or a folder (a
    device or a pipe, written in place)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def open_special(path: str | Path) -> IO[str]:
    """A device or pipe opened for writing text; a FIFO that no process reads is refused
    at once (ENXIO) instead of blocking until one does."""
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "w", encoding="utf-8")


@contextlib.contextmanager
def whole_file(path: str | Path, *, keep_on_interrupt: bool = False) -> Iterator[IO[str]]:
    """A text file to write ``path``'s new content to: a temporary file in its folder
    (through a symbolic link, the target's), renamed over it when the block ends without
    an exception, removed otherwise; the new file has the permissions a new file gets, or
    the replaced file's. With ``keep_on_interrupt``, Ctrl-C also keeps what was written.
    A device or pipe (``/dev/stdout``, a FIFO) is written in place."""
    if is_special(path):
        with open_special(path) as f:
            yield f
        return
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    umask = os.umask(0)
    os.umask(umask)
    try:
        mode = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~umask
    import tempfile  # (on first use: tempfile imports shutil, random)

    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=target.parent)
    keep = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            try:
                yield f
            except KeyboardInterrupt:
                keep = keep_on_interrupt
                raise
            keep = True
    finally:
        try:
            if keep:
                os.chmod(tmp, mode)
                os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
