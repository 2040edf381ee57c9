"""Which cards an actor's process may see.

Ray sets ASCEND_RT_VISIBLE_DEVICES (NPU) or CUDA_VISIBLE_DEVICES (GPU) for an actor from the
resources it holds. vllm-ascend's docs tell operators to start Ray with
RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1, which turns that off: every actor would then
see every card on its node and all would pile onto card 0. In that case the actor sets the
variable itself from the accelerator ids Ray assigned it, before torch_npu is imported.
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping

# device -> (Ray's opt-out flag, the visibility variable, Ray's resource name)
VISIBILITY = {
    "npu": ("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "NPU"),
    "cuda": ("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU"),
}


def _assigned_ids() -> dict[str, list[str]]:
    import ray

    ids: dict[str, list[str]] = ray.get_runtime_context().get_accelerator_ids()
    return ids


def pin_visible_devices(
    device: str,
    *,
    env: MutableMapping[str, str] = os.environ,
    assigned: Callable[[], dict[str, list[str]]] = _assigned_ids,
) -> str | None:
    """Make the process see only its own cards; returns the visible-devices value in force."""
    if device not in VISIBILITY:
        return None
    flag, variable, resource = VISIBILITY[device]
    if env.get(flag, "0").lower() not in ("1", "true"):
        return env.get(variable)  # Ray isolated the actor already
    ids = assigned().get(resource) or []
    if not ids:
        msg = f"{flag} is set but Ray assigned this actor no {resource} ids; cannot tell which card is ours"
        raise RuntimeError(msg)
    env[variable] = ",".join(str(i) for i in ids)
    return env[variable]
