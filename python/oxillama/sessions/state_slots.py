"""Hybrid snapshots from before the recurrent state kept only the recurrent
layers. Their KV section ends in a state with a slot for every layer, an
attention layer's all zeros; today's has slots for the layers in
``recurrent_layers`` alone, in the same order (every convolution state, then
every SSM state). :func:`compact_every_layer_state` turns the old section
into today's, so such a file restores exactly as it did."""

from __future__ import annotations

from typing import Any

import numpy as np


def _floats_per_layer(ssm: dict[str, Any]) -> tuple[int, int]:
    """Floats of one layer's convolution state and SSM state (the layout
    ``docs/snapshot-format.md`` gives)."""
    d_conv, d_inner = int(ssm["d_conv"]), int(ssm["d_inner"])
    n_group, d_state = int(ssm["n_group"]), int(ssm["d_state"])
    return (d_conv - 1) * (d_inner + 2 * n_group * d_state), d_inner * d_state


def compact_every_layer_state(
    section: memoryview, want: int, cfg: dict[str, Any]
) -> memoryview | None:
    """``section`` in today's layout if it is a hybrid's KV section of
    ``want`` bytes in the every-layer layout, with zeros in every attention
    layer's slot; ``None`` otherwise (the caller reports the length)."""
    if not cfg.get("hybrid"):
        return None
    n_layer, recr = int(cfg["n_layer"]), [int(i) for i in cfg["recurrent_layers"]]
    conv, ssm = _floats_per_layer(cfg["ssm"])
    extra = (n_layer - len(recr)) * (conv + ssm) * 4
    if not recr or extra == 0 or len(section) != want + extra:
        return None
    rows = len(section) - n_layer * (conv + ssm) * 4
    state = np.frombuffer(section[rows:], dtype="<f4")
    convs = state[: n_layer * conv].reshape(n_layer, conv)
    ssms = state[n_layer * conv :].reshape(n_layer, ssm)
    others = [il for il in range(n_layer) if il not in recr]
    if np.any(convs[others]) or np.any(ssms[others]):
        return None
    out = bytes(section[:rows]) + convs[recr].tobytes() + ssms[recr].tobytes()
    return memoryview(out)
