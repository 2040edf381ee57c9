"""Directories in a node's cache that are built once, by whoever asks first: a synthetic model,
a converted GGUF checkpoint, a fetched wheel.

Several actors (processes) on one node may ask for the same directory at the same time. The first
builds it under a file lock, in a temporary sibling directory that it renames into place with the
marker file already inside, so a reader sees either no directory or a complete one; the others
wait on the lock and find it done. A build that fails leaves nothing behind.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

from fleet.contracts.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable


def build_once(out_dir: Path, write: Callable[[Path], str], *, marker: str, root: Path) -> Path:
    """Return `out_dir`, first built by `write(tmp)` unless its `marker` file exists already.

    `write` fills the empty directory `tmp` and returns the text of the marker file. `out_dir` must
    be an entry directly in the cache directory `root`: an incomplete one is deleted (rmtree), so
    a name that walks out of the cache (`..`, a symlink) is refused before anything is touched.
    """
    if ".." in out_dir.parts or out_dir.resolve().parent != root.resolve() or out_dir.name.startswith("."):
        msg = f"cache entry {str(out_dir)[:200]!r} is not a directory directly in {str(root)[:200]!r}"
        raise UserError(msg)
    if (out_dir / marker).is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Not with_suffix: a directory name with a dot in it would share a lock with its siblings.
    with FileLock(out_dir.with_name(out_dir.name + ".lock")):
        if (out_dir / marker).is_file():  # another process finished it while we waited
            return out_dir
        shutil.rmtree(out_dir, ignore_errors=True)  # no marker: incomplete, and the rename needs it gone
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        try:
            text = write(tmp)
            (tmp / marker).write_text(text)
            # mkdtemp and safetensors make owner-only entries; the cache is meant to be shared.
            tmp.chmod(0o755)
            for f in tmp.iterdir():
                f.chmod(0o644)
            tmp.rename(out_dir)  # atomic: readers see no directory or a complete one
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
