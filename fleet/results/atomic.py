"""Files that appear whole or not at all, locally and on an object store.

Locally a file is written to a hidden temp name, fsynced and renamed into place; an object store has
no rename but shows an object only once its upload is complete, so there it is put in one request.
A reader therefore never sees half a file under a name it picks up (readers skip dot-files).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from fleet.contracts.errors import StoreError


def put(fs: pafs.FileSystem, path: str, data: bytes | pa.Buffer) -> None:
    """`path` holds `data` whole or not at all."""
    if isinstance(fs, pafs.LocalFileSystem):
        with written_beside(fs, path) as tmp:
            Path(tmp).write_bytes(data)
        return
    with refused(path), fs.open_output_stream(path) as out:
        out.write(data)


@contextlib.contextmanager
def written_beside(fs: pafs.LocalFileSystem, path: str) -> Iterator[str]:
    """A hidden temp name beside local `path` (its directory made) for the block to write; then
    flushed and renamed to `path`, or removed if the block failed. Unique to this call: two
    processes writing one file (readers refreshing a catalog) must not write into each other's."""
    with refused(path):
        directory, name = path.rsplit("/", 1)
        fs.create_dir(directory, recursive=True)
        tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            yield tmp
            sync_and_rename(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)  # only left when the write failed


@contextlib.contextmanager
def refused(path: str) -> Iterator[None]:
    """An OSError while writing `path` (no space, no permission, an object store's error) as a
    StoreError that names the path: the run's storage failed, not fleet."""
    try:
        yield
    except StoreError:
        raise
    except OSError as e:
        raise StoreError(path, e.strerror or str(e)) from e


def sync_and_rename(tmp: str, path: str) -> None:
    """Flush `tmp` to disk before it takes `path`'s name: after a power cut a file that is there is whole."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    Path(tmp).replace(path)
