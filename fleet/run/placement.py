"""Where an engine goes: what one engine of a target holds (its `footprint`, as placement-group
bundles), the Ray options and group its actor starts with, what one model holds while it runs
(its `reservation`), and whether a cluster can ever run a manifest (checked before anything starts).

Everything here is derived from `bundles`: the admission arithmetic and the group Ray reserves
cannot disagree about what an engine holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet.contracts.targets import TargetArgs
    from fleet.run.manifest import Manifest

# The cluster_resources() key of one card, by device (cpu has none: its ranks are cores).
CARD = {"cuda": "GPU", "npu": "NPU"}


def bundles(target: TargetArgs) -> list[dict[str, float]]:
    """The placement-group bundles one engine of `target` reserves, as cluster_resources() keys.

    On one node: a single bundle holding the actor's CPUs and all its cards. Over several
    nodes: one bundle per card, the way Ray's own LLM batch API reserves them for vLLM's Ray
    executor (which refuses a bundle with more than one card); the first also holds the actor's
    CPUs, and every bundle carries `resources` (e.g. an accelerator_type on each card's node).
    """
    extra = {k: float(v) for k, v in target.resources.items()}
    if target.spans_nodes:
        each = {CARD[target.device]: 1.0} | extra
        return [{"CPU": float(target.num_cpus)} | each] + [dict(each) for _ in range(target.cards - 1)]
    held = {"CPU": float(target.num_cpus)}
    if target.device in CARD:
        key = CARD[target.device]
        held[key] = extra.pop(key, 0.0) + target.cards
    return [{k: v for k, v in (held | extra).items() if v}]


def footprint(target: TargetArgs) -> dict[str, float]:
    """What one engine of `target` holds in all (its actor and every card, over however many
    nodes), as cluster_resources() keys."""
    return add(*bundles(target))


def actor_options(target: TargetArgs) -> dict[str, Any]:
    """Ray options for `target`'s actor: its bundle's resources; over several nodes without the
    cards, which belong to vLLM's Ray workers, one per bundle."""
    held = dict(bundles(target)[0])
    if target.spans_nodes:
        del held[CARD[target.device]]
    options: dict[str, Any] = {"num_cpus": held.pop("CPU")}
    if "GPU" in held:
        options["num_gpus"] = held.pop("GPU")
    if held:
        options["resources"] = held
    return options


def reserve(target: TargetArgs) -> tuple[Any, dict[str, Any]]:
    """The placement group (None for one card) and Ray options of one actor of `target`.

    Reserved atomically for this engine. On one node: one bundle with all its cards
    (STRICT_PACK). Over nodes: one bundle per card, packed onto as few nodes as hold them, the
    actor in the first; vLLM's Ray executor finds this group from inside the actor
    (ray.util.get_current_placement_group) and puts one worker in each card's bundle.
    """
    options = actor_options(target)
    if target.cards == 1:
        return None, options
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group(bundles(target), strategy="PACK" if target.spans_nodes else "STRICT_PACK")
    options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=target.spans_nodes
    )
    return pg, options


def places(target: TargetArgs, nodes: list[dict[str, float]]) -> bool:
    """Whether some nodes could ever hold `target`: all of it on one node, or, over several nodes,
    each pipeline stage's cards on one node and the actor's CPUs beside one stage (vLLM splits the
    ranks into stages node by node; a stage across nodes would run tensor parallelism over the
    network, so it is not counted)."""
    if not target.spans_nodes:
        return any(fits(footprint(target), node) for node in nodes)
    card = bundles(target)[-1]  # one card and the target's extra resources
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


def apart(manifest: Manifest, cluster: dict[str, float]) -> list[str]:
    """The candidates that cannot hold their resources beside the reference's on `cluster` (e.g. a
    tensor-parallel CPU target beside the reference on a 2-core laptop, or a one-card host)."""
    ref = footprint(manifest.target(manifest.reference))
    candidates = [t for t in manifest.targets if t.name != manifest.reference]
    return [t.name for t in candidates if not fits(add(ref, footprint(t)), cluster)]


def turns_note(manifest: Manifest, cluster: dict[str, float]) -> str | None:
    """What `fleet run` says when models take turns on `cluster` (None: they do not)."""
    names = apart(manifest, cluster)
    if not names:
        return None
    ref = manifest.reference
    need = add(footprint(manifest.target(ref)), footprint(manifest.target(names[0])))
    have = {k: cluster.get(k, 0.0) for k in need}
    more = f" ({len(names)} candidates do not fit beside {ref})" if len(names) > 1 else ""
    return (
        f"taking turns: {ref} + {names[0]} need {need} at once, the cluster has {have}{more}; each model's "
        f"candidates generate first, their rows staged, then {ref} generates and scores them"
    )


def takes_turns(manifest: Manifest, cluster: dict[str, float]) -> bool:
    """Whether each model's reference and candidates take turns on `cluster`, some candidate not
    fitting beside the reference: the candidates generate with the reference down, their rows stored
    (fleet/results/staging.py); then the reference generates its own shards and scores them."""
    return bool(apart(manifest, cluster))


def reservation(manifest: Manifest, cluster: dict[str, float]) -> dict[str, float]:
    """What one model holds while it runs: every target at once when the cluster could ever fit
    that; else the reference plus the largest candidate (candidates then take turns beside it);
    else, taking turns with the reference, the largest single target. And beside them the CPUs of
    its largest perf level's client actors, which no other model, nor its own targets, may take
    meanwhile (`engines` is what its targets may hold)."""
    clients = client_cpus(manifest)
    ref = footprint(manifest.target(manifest.reference))
    everything = add(*(footprint(t) for t in manifest.targets))
    if fits(add(everything, clients), cluster):
        return add(everything, clients)
    if takes_turns(manifest, cluster):
        return add(_largest([footprint(t) for t in manifest.targets]), clients)
    pairs = [add(ref, footprint(t)) for t in manifest.targets if t.name != manifest.reference] or [ref]
    return add(_largest(pairs), clients)


def engines(manifest: Manifest, reserved: dict[str, float]) -> dict[str, float]:
    """What a model's targets may hold at once of its reservation `reserved`: all but its perf
    client actors' CPUs, which stay free for them (a candidate started into them would leave a
    level's clients waiting until they time out)."""
    clients = client_cpus(manifest)
    return {k: v - clients.get(k, 0.0) for k, v in reserved.items()}


def client_cpus(manifest: Manifest) -> dict[str, float]:
    """The most CPUs one perf level's client actors hold at once (Scenario.client_actor_cpus), as
    cluster_resources() keys (none without such a level)."""
    most = max((s.client_actor_cpus for s in manifest.perf), default=0.0)
    return {"CPU": most} if most > 0 else {}


def _largest(needs: list[dict[str, float]]) -> dict[str, float]:
    """Enough for any one of `needs` (the largest of each resource)."""
    return {k: max(n.get(k, 0.0) for n in needs) for k in set().union(*needs)}


def check_fits(manifest: Manifest, cluster: dict[str, float], nodes: list[dict[str, float]] | None = None) -> None:
    """Fail before anything starts when a target's cards are not on any one node (a multi-node
    target: its pipeline stages are not on as many nodes), or a target alone needs more than the
    cluster has: anything less would wait forever. (This cluster does not autoscale for us.) A
    reference and candidate that do not fit together are no error: they take turns (takes_turns)."""
    for target in manifest.targets:
        if nodes is not None and not places(target, nodes):
            if target.spans_nodes:
                tp, pp = target.tensor_parallel_size, target.pipeline_parallel_size
                msg = (
                    f"target {target.name!r} needs {pp} stages of {tp} cards, each stage on one node and the "
                    f"actor's {target.num_cpus:g} CPUs beside one; no set of nodes has that"
                )
            else:
                msg = f"target {target.name!r} needs {footprint(target)} on one node; no node has that"
            raise RuntimeError(msg)
    for target in manifest.targets:
        want = footprint(target)
        if not fits(want, cluster):
            short = {k: v for k, v in want.items() if cluster.get(k, 0.0) < v}
            have = {k: cluster.get(k, 0.0) for k in short}
            msg = f"target {target.name!r} alone needs {short}; the cluster has {have}"
            raise RuntimeError(msg)
    _check_clients(manifest, cluster)


def _check_clients(manifest: Manifest, cluster: dict[str, float]) -> None:
    """A perf level spread over client actors (Scenario.clients) holds their CPUs beside its target's
    own, and beside the reference's unless the model takes turns (the reference is up while its
    candidates run): where the cluster has fewer in all, the clients could only time out, after the
    parity work."""
    ref = manifest.target(manifest.reference)
    beside = [] if takes_turns(manifest, cluster) else [ref]
    for i, scenario in enumerate(manifest.perf):
        if scenario.client_actor_cpus <= 0:
            continue
        clients = {"CPU": scenario.client_actor_cpus}
        for target in manifest.targets:
            if not target.can("perf") or (scenario.targets is not None and target.name not in scenario.targets):
                continue
            up = [target, *(t for t in beside if t.name != target.name)]
            want = add(*(footprint(t) for t in up), clients)
            if not fits(want, cluster):
                also = f" beside the reference {ref.name!r}" if len(up) > 1 else ""
                msg = (
                    f"perf[{i}] {scenario.name!r}: target {target.name!r}{also} and its {scenario.clients} client "
                    f"actors of {scenario.client_cpus:g} CPUs need {{'CPU': {want['CPU']:g}}} at once; the cluster has "
                    f"{{'CPU': {cluster.get('CPU', 0.0):g}}}: lower clients or client_cpus (0: the clients share the "
                    "cores the target leaves), or add nodes"
                )
                raise RuntimeError(msg)
