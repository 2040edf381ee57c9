"""What fleet asks of every vLLM engine rank, as a worker extension called by method name.

vLLM runs its ranks in other processes: the engine core's child on a GPU or NPU
(`VLLM_ENABLE_V1_MULTIPROCESSING=1`, the default there), the `mp` executor's rank processes, or
Ray workers on other nodes. `LLM.collective_rpc` sends its arguments across with msgspec, which
refuses a Python function unless the user allows pickle (`VLLM_ALLOW_INSECURE_SERIALIZATION`,
which fleet never sets). A method name crosses as a plain string, so fleet names this class as
the engine's `worker_extension_cls` (vLLM's supported way to add worker methods, as in its RLHF
examples; vLLM mixes it into whatever worker class the platform uses, vllm-ascend's NPU worker
included) and calls `collective_rpc(RANK_FACTS, ...)`. Arguments and results are str, bool and
int only.
"""

from __future__ import annotations

from typing import Any

# engine_args["worker_extension_cls"] as vLLM resolves it: importable in every rank's process.
WORKER_EXTENSION = "actors.vllm_worker.FleetRankFacts"
RANK_FACTS = "fleet_rank_facts"


class FleetRankFacts:
    """Mixed into each rank's worker by vLLM; the method name is prefixed so it cannot shadow a
    worker attribute (vLLM refuses an extension that would)."""

    def fleet_rank_facts(self, device: str, with_device: bool) -> dict[str, Any]:
        """The threads torch really uses in this rank and its host; with `with_device`, the device
        facts of this rank's process (a multi-node engine's actor holds no card to ask)."""
        import socket

        import torch

        from actors.provenance import describe

        facts: dict[str, Any] = {"torch_threads": int(torch.get_num_threads()), "hostname": socket.gethostname()}
        return facts | ({"device": describe(device)} if with_device else {})
