"""Tables that a later run reads, written whole or not at all (lessons 76-81, `make bench`).

A table written in place (`open(path, "w")`) is empty from the first moment and complete only
at the last: a full disk, a Ctrl-C or a killed `make bench` leaves it cut short, and every later
run that reads it fails until someone deletes it. `replacing(path)` writes into a new file in
the same folder and moves it over `path` only once it is complete and on disk (`os.replace` is
atomic within a file system), so a reader finds the old table or the new one, never a part.

    with replacing(path) as handle:
        handle.write(text)            # path changes only here, when the block ends
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO


@contextmanager
def replacing(path: Path | str) -> Iterator[TextIO]:
    """A text file (UTF-8, newlines as written) that replaces `path` when the block ends.

    If the block raises (or the disk fills), `path` keeps what it held and the new file is
    deleted; a process killed meanwhile leaves `path` whole and, at worst, a hidden
    `.<name>.*.tmp` file beside it.
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    # Made as open() makes a file (0o666 less the umask), so the table keeps the usual mode.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(descriptor, "w", encoding="utf-8", newline="") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())  # the bytes are on disk before the name points at them
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """Put the folder's new entry on disk too, where the system lets a folder be opened."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows cannot open a folder: its replace is durable enough
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the file itself is synced
    finally:
        os.close(descriptor)
