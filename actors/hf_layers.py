"""Hidden states of a transformers model, layer by layer, for the layer probe and the drill-down.

transformers' `hidden_states` holds L + 1 tensors: [0] the embeddings (input of layer 1), [i] the
output of decoder layer i, except that [L] is replaced by the final norm's output. With the
config's `tie_last_hidden_states` off for the call, [L] stays the last decoder layer's output and
`last_hidden_state` gives the norm's: rows are layer 0 (embed), 1..L (decoder) and L + 1 (norm). A
model whose code ignores that switch (hidden_states[L] is the norm's output) has no row L.

With `sublayers`, forward hooks on each decoder layer's attention and MLP modules add their
outputs (before the residual add) as rows (i, "attention") and (i, "mlp"): where inside layer i an
error starts. The modules are found by the names Llama, Qwen2, Mistral, Gemma and most decoder
layers in transformers use (`self_attn`, `mlp`); a layer without them gets no sub-layer rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

ATTENTION, MLP = ("self_attn", "attention"), ("mlp", "feed_forward")  # module names, most common first


def capture(
    net: Any, ids: list[int], *, device: Any, last_only: bool, sublayers: bool
) -> tuple[list[tuple[int, str]], list[np.ndarray]]:
    """One forward pass of `net` over `ids`: (layer, kind) labels and the [positions, hidden] float32
    state of each, in depth order (a layer's attention and MLP rows before its output row)."""
    import torch

    decoder, config, absent = net.get_decoder(), net.config, object()
    saved = getattr(config, "tie_last_hidden_states", absent)
    hooked: dict[tuple[int, str], Any] = {}
    try:
        config.tie_last_hidden_states = False
        with _hooks(decoder, hooked) if sublayers else contextlib.nullcontext(), torch.inference_mode():
            result = decoder(input_ids=torch.tensor([ids], device=device), output_hidden_states=True)
    finally:
        if saved is absent:
            del config.tie_last_hidden_states
        else:
            config.tie_last_hidden_states = saved
    states, final = list(result.hidden_states), result.last_hidden_state
    n_layers = len(states) - 1
    layers = [(0, "embed")] + [(i, "decoder") for i in range(1, n_layers + 1)]
    if torch.equal(states[-1], final):  # the switch was ignored: [L] is the norm's output
        states, layers = states[:-1], layers[:-1]
    states.append(final)
    layers.append((n_layers + 1, "norm"))
    by_label = dict(zip(layers, states, strict=True)) | hooked
    order = sorted(by_label, key=lambda label: (label[0], _DEPTH[label[1]]))
    keep = slice(len(ids) - 1, len(ids)) if last_only else slice(None)
    return order, [by_label[label][0, keep].float().cpu().numpy() for label in order]


_DEPTH = {"embed": 0, "attention": 1, "mlp": 2, "decoder": 3, "norm": 4}  # order within one layer index


@contextlib.contextmanager
def _hooks(decoder: Any, out: dict[tuple[int, str], Any]) -> Iterator[None]:
    """Forward hooks storing each decoder layer's attention and MLP output under (layer, kind)."""
    handles = []
    for i, layer in enumerate(getattr(decoder, "layers", ()), start=1):
        for kind, names in (("attention", ATTENTION), ("mlp", MLP)):
            module = next((getattr(layer, n) for n in names if hasattr(layer, n)), None)
            if module is not None:
                handles.append(module.register_forward_hook(_store(out, (i, kind))))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _store(out: dict[tuple[int, str], Any], label: tuple[int, str]) -> Any:
    def hook(module: Any, args: Any, output: Any) -> None:
        # Attention returns (hidden, weights[, cache]); an MLP returns the tensor itself.
        out[label] = (output[0] if isinstance(output, tuple) else output).detach()

    return hook
