"""Resource arithmetic for placement: what a target's actor holds, what a model holds while it
runs, and whether a cluster can ever run a manifest (checked before anything starts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleet.contracts.targets import TargetArgs
    from fleet.run.manifest import Manifest


def need(target: TargetArgs) -> dict[str, float]:
    """The Ray resources one engine of `target` holds (its actor and every card, over however many
    nodes), as cluster_resources() keys."""
    return add(*target.bundles())


def places(target: TargetArgs, nodes: list[dict[str, float]]) -> bool:
    """Whether some nodes could ever hold `target`: all of it on one node, or, over several nodes,
    each pipeline stage's cards on one node and the actor's CPUs beside one stage (vLLM splits the
    ranks into stages node by node; a stage across nodes would run tensor parallelism over the
    network, so it is not counted)."""
    if not target.spans_nodes:
        return any(fits(need(target), node) for node in nodes)
    card = target.bundles()[-1]  # one card and the target's extra resources
    stage = {k: v * target.tensor_parallel_size for k, v in card.items()}
    actor = {"CPU": float(target.num_cpus)}
    counts = [_copies(stage, node) for node in nodes]
    most = 0
    for i, node in enumerate(nodes):  # the actor's node must hold a stage beside the actor
        left = {k: v - actor.get(k, 0.0) for k, v in node.items()}
        if fits(actor, node) and (here := _copies(stage, left)) >= 1:
            most = max(most, here + sum(counts) - counts[i])
    return most >= target.pipeline_parallel_size


def _copies(want: dict[str, float], have: dict[str, float]) -> int:
    """How many times `want` fits in `have`."""
    counts = [int((have.get(k, 0.0) + 1e-9) // v) for k, v in want.items() if v > 0]
    return min(counts, default=0)


def add(*needs: dict[str, float]) -> dict[str, float]:
    total: dict[str, float] = {}
    for n in needs:
        for k, v in n.items():
            total[k] = total.get(k, 0.0) + v
    return total


def fits(want: dict[str, float], have: dict[str, float]) -> bool:
    return all(have.get(k, 0.0) >= v - 1e-9 for k, v in want.items())


def footprint(manifest: Manifest, cluster: dict[str, float]) -> dict[str, float]:
    """What one model holds while it runs: every target at once when the cluster could ever fit
    that, else the reference plus the largest candidate (candidates then take turns)."""
    ref = manifest.target(manifest.reference)
    everything = add(*(need(t) for t in manifest.targets))
    if fits(everything, cluster):
        return everything
    pairs = [add(need(ref), need(t)) for t in manifest.targets if t.name != ref.name] or [need(ref)]
    return {k: max(p.get(k, 0.0) for p in pairs) for k in set().union(*pairs)}


def check_fits(manifest: Manifest, cluster: dict[str, float], nodes: list[dict[str, float]] | None = None) -> None:
    """Fail before anything starts when a target's cards are not on any one node (a multi-node
    target: its pipeline stages are not on as many nodes), or the
    reference and a candidate cannot hold cards at once: the reference stays up to score every
    candidate, so anything less would wait forever. (This cluster does not autoscale for us.)"""
    for target in manifest.targets:
        if nodes is not None and not places(target, nodes):
            if target.spans_nodes:
                tp, pp = target.tensor_parallel_size, target.pipeline_parallel_size
                msg = (
                    f"target {target.name!r} needs {pp} stages of {tp} cards, each stage on one node and the "
                    f"actor's {target.num_cpus:g} CPUs beside one; no set of nodes has that"
                )
            else:
                msg = f"target {target.name!r} needs {need(target)} on one node; no node has that"
            raise RuntimeError(msg)
    want = footprint(manifest, cluster)
    if not fits(want, cluster):
        short = {k: v for k, v in want.items() if cluster.get(k, 0.0) < v}
        have = {k: cluster.get(k, 0.0) for k in short}
        msg = f"a model needs {short} at once (reference + largest candidate); the cluster has {have}"
        raise RuntimeError(msg)
