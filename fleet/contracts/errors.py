"""Errors that are not bugs in fleet: the CLI prints them as a message, no traceback. Bad input
exits 2; a results store that refuses a write mid-run exits 6."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or an impossible request; the message says what and where."""


class ManifestError(UserError):
    """A manifest that does not validate: the message names the file, the field and what was expected."""


class StoreError(OSError):
    """The results store refused a write (no space left, no permission, a read-only file system, an
    object store's error): neither the user's input nor a bug in fleet. A run stops there with its
    committed shards kept (`fleet run --resume` continues it once the store takes writes again); the
    CLI says where and why, exit 6. An OSError, so the callers that treat a write as best effort
    (the runs catalog, a cache) still do."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason
        self.run_dir: str | None = None  # the run being written, where the driver knows it

    def __reduce__(self) -> tuple[type[StoreError], tuple[str, str]]:
        return StoreError, (self.path, self.reason)  # raised in an actor, it crosses Ray pickled


class Stopped(KeyboardInterrupt):
    """SIGTERM while a run goes (`ray job stop`, a scheduler's preemption, `kill`): the run stops as
    on Ctrl-C, recorded `interrupted`, resumable; the CLI exits 143 (128 + SIGTERM)."""
