"""Expanding a manifest into shards: model x target x prompt-set chunk, the unit of work.

A shard is what one actor generates in one call, what is retried when an actor dies, and what
is written as one Parquet file per table, so its id is stable across runs of one manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.manifest import Manifest, Prompt


@dataclass(frozen=True)
class Shard:
    model: str
    target: str
    prompt_set: str
    index: int
    prompts: tuple[Prompt, ...]

    @property
    def shard_id(self) -> str:
        return f"{self.model}/{self.target}/{self.prompt_set}/{self.index:05d}"


def plan(manifest: Manifest) -> list[Shard]:
    """All shards, grouped by model; within a model the reference's shards come first."""
    targets = sorted(manifest.targets, key=lambda t: t.name != manifest.reference)
    size = manifest.run.shard_size
    return [
        Shard(model.name, target.name, set_name, i // size, tuple(prompts[i : i + size]))
        for model in manifest.models
        for target in targets
        for set_name, prompts in manifest.prompts.items()
        for i in range(0, len(prompts), size)
    ]
