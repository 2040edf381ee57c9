"""A copy of a checkpoint with seeded noise in its weights: `fleet calibrate`'s weight mutants.

A port that converts or loads weights slightly wrong (a lossy cast, a transposed scale, a shard
mixed up) moves every logprob a little. To measure whether the gates see that, a target with
`weight_noise: {seed, relative}` loads a copy of its model in which every floating-point tensor
`w` becomes `w + relative * rms(w) * N(0, 1)`, the noise drawn per tensor from a generator
seeded by the seed and the tensor's name: the same spec gives the same bytes on every node.
With `tensors` (a shell pattern over tensor names, e.g. `model.layers.1.self_attn.*`) only the
matching tensors get noise: one layer broken on purpose, which the drill-down should name.
The copy keeps each tensor's dtype, as a converted checkpoint would: in a bfloat16 checkpoint
(8 significant bits, steps of ~0.4 % of a value) noise far below that step changes only the
weights much smaller than the tensor's RMS, so the change actually made is smaller than
`relative` says; the copy's digest and the measured logprobs are what count.

The copy is made on disk, before the engine starts, rather than in the loaded model: engines
repack weights at load (vLLM's CPU linear layers hand them to oneDNN and drop the original
tensors, vllm-ascend converts to NZ layout), so changing a loaded model reaches some layers and
not others, differently per device. A file on disk reaches every backend the same way, and the
provenance digest of the copy says it is not the original.
"""

from __future__ import annotations

import shutil
import zlib
from fnmatch import fnmatchcase as fnmatch
from pathlib import Path
from typing import TYPE_CHECKING

from actors.build_once import build_once
from fleet.contracts.errors import UserError
from fleet.contracts.sources import cache_root

if TYPE_CHECKING:
    from fleet.contracts.backend_args import WeightNoise

MARKER = ".complete"


def noisy_copy(model_dir: Path, digest: str, noise: WeightNoise) -> Path:
    """The directory of `model_dir`'s copy with `noise` added (built once per node; `digest` is
    the original weights' digest, part of the cache key)."""
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights:
        msg = f"{model_dir}: weight_noise needs safetensors weights, and this model has none"
        raise UserError(msg)
    root = cache_root() / "weight-noise"
    only = "" if noise.tensors is None else f"-only{zlib.crc32(noise.tensors.encode()):08x}"
    out = root / f"{digest}-seed{noise.seed}-rel{noise.relative:g}{only}"

    def write(tmp: Path) -> str:
        for f in model_dir.iterdir():
            if f.is_file() and f.suffix != ".safetensors" and not f.name.startswith("."):
                shutil.copyfile(f, tmp / f.name)  # config, tokenizer: small, and a copy stays valid
        names = [name for f in weights for name in _write_noisy(f, tmp / f.name, noise)]
        if noise.tensors is not None and not any(fnmatch(n, noise.tensors) for n in names):
            msg = f"{model_dir}: weight_noise.tensors {noise.tensors!r} matches no floating-point tensor; "
            raise UserError(msg + f"names look like {', '.join(names[:3])}")
        return noise.model_dump_json() + "\n"

    return build_once(out, write, marker=MARKER, root=root)


def _write_noisy(src: Path, dst: Path, noise: WeightNoise) -> list[str]:
    """Write `src` with noise in its (matching) floating-point tensors; returns their names."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors, floating = {}, []
    with safe_open(str(src), framework="pt") as f:
        metadata = f.metadata()
        for name in f.keys():  # noqa: SIM118  (safe_open is not a dict)
            w = f.get_tensor(name)
            floating += [name] if w.is_floating_point() else []
            if w.is_floating_point() and w.numel() and (noise.tensors is None or fnmatch(name, noise.tensors)):
                gen = torch.Generator().manual_seed(noise.seed * 1_000_003 + zlib.crc32(name.encode()))
                w32 = w.to(torch.float32)
                scale = noise.relative * w32.pow(2).mean().sqrt()
                w = (w32 + scale * torch.randn(w.shape, generator=gen)).to(w.dtype)
            tensors[name] = w.contiguous()
    save_file(tensors, str(dst), metadata=metadata)
    return floating
