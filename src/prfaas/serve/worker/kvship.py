"""What a prefill worker puts on the KV transport for one request, and how a decode worker
reads it back. The transport carries named numpy arrays per (request, layer); on top of it:

- per layer `i`: the layer's tensors (`layer_kv_to_arrays`) plus `range` = int64 [start, end]
  (the token range the rows cover, which the transport does not know); a full-attention layer's
  tensors in the link's wire dtype (transport/quant.py: bf16 words, or fp8 codes plus
  `<name>.scale`), decoded back to float32 by `read_shipped`;
- per linear layer, when the prompt's last full block boundary B lies inside the shipped range:
  `snap.<name>` = the layer's state at B, so the decode worker can keep a reusable prefix;
- on the request layer `META_LAYER` (kind none): `logits` (float32 [vocab], last prompt
  position: the decode worker samples the first token from it, exactly as `generate` does) and
  `snap_at` = int64 [B] (0 when no snapshot was shipped).
Rows shipped are [ship_from, L): the decode worker already holds [0, ship_from).
A layer leaves the engine's device through the worker's LayerShipper (`ship_layer`: on a GPU
the model thread only issues the copies; `ShippedLayer.arrays` waits for them beside the
sender); on the CPU its tensors are ready at once and are encoded on the model thread.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from prfaas.core.errors import TransportError
from prfaas.engine import LayerKV, SequenceKV, layer_kv_from_arrays, layer_kv_to_arrays
from prfaas.engine.shipper import LayerShipper, Ticket
from prfaas.transport import ReceivedKV
from prfaas.transport.quant import decode_arrays, encode_arrays

META_LAYER = 0xFFFF
FULL_ATTN = ("mla", "gqa")


def reframe(layer: LayerKV, ship_from: int, prefix: SequenceKV | None) -> LayerKV:
    """The layer's KV for [ship_from, end) given the hook's KV for [computed_from, end):
    full-attention rows of the prefill node's cached prefix are prepended, rows the decode
    node already holds are cut. Linear states and SWA windows are already complete."""
    if layer.kind not in FULL_ATTN or layer.start_token == ship_from:
        return layer
    if layer.start_token > ship_from:
        if prefix is None:
            raise TransportError(f"layer {layer.layer_index}: rows [{ship_from}, "
                                 f"{layer.start_token}) needed but no cached prefix")
        head = prefix.export_layer(layer.layer_index, ship_from, layer.start_token)
        tensors = {n: torch.cat([head.tensors[n], t]) for n, t in layer.tensors.items()}
    else:
        cut = ship_from - layer.start_token
        tensors = {n: t[cut:] for n, t in layer.tensors.items()}
    return LayerKV(layer.layer_index, layer.kind, ship_from, layer.end_token, tensors)


def layer_arrays(layer: LayerKV, wire_dtype: str | None = None) -> list[tuple[str, np.ndarray]]:
    arrays = layer_kv_to_arrays(layer)
    if layer.kind in FULL_ATTN:  # linear states and SWA windows keep their dtype
        arrays = encode_arrays(arrays, wire_dtype)
    arrays.append(("range", np.array([layer.start_token, layer.end_token], dtype=np.int64)))
    return arrays


@dataclass(slots=True)
class ShippedLayer:
    """A layer on its way off the device: its token range and kind, a ticket per tensor."""

    layer: LayerKV  # the tensors as the engine gave them (on its device)
    tickets: dict[str, Ticket]
    ready: list[tuple[str, np.ndarray]] | None = None  # encoded already (tickets were done)

    def arrays(self, wire_dtype: str | None) -> list[tuple[str, np.ndarray]]:
        """The layer's arrays as they travel; waits for its copies (the sender's thread)
        and raises ShipError (a TransportError) when one failed."""
        if self.ready is not None:
            return self.ready
        host = {name: ticket.wait() for name, ticket in self.tickets.items()}
        layer = self.layer
        return layer_arrays(LayerKV(layer.layer_index, layer.kind, layer.start_token,
                                    layer.end_token, host), wire_dtype)

    def discard(self) -> None:
        """Its request failed: give its copies' host memory back unread (sender's thread)."""
        for ticket in self.tickets.values():
            ticket.discard()


def ship_layer(shipper: LayerShipper, request_id: int, layer: LayerKV,
               wire_dtype: str | None) -> ShippedLayer:
    """Start the layer's tensors toward the host (model thread, never waits on the device);
    when they are there already (CPU), encode them now, as the model thread always did."""
    tickets = {name: shipper.ship(request_id, functools.partial(_same, t), t.shape, t.dtype,
                                  keep=(t,))
               for name, t in sorted(layer.tensors.items())}
    out = ShippedLayer(layer, tickets)
    if all(t.done() for t in tickets.values()):
        out.ready = out.arrays(wire_dtype)
    return out


def _same(t: torch.Tensor) -> torch.Tensor:
    """The gather of an engine layer: its tensors are gathered already (export_layer)."""
    return t


def snapshot_arrays(kv: SequenceKV, boundary: int) -> list[tuple[int, str, np.ndarray]]:
    """(layer, name, array) of every linear layer's state at `boundary` (a block boundary)."""
    out: list[tuple[int, str, np.ndarray]] = []
    for i, store in enumerate(kv.stores):
        layer = kv.export_layer(i, boundary, boundary) if _is_linear(store) else None
        if layer is None:
            continue
        for name, t in sorted(layer.tensors.items()):
            out.append((i, f"snap.{name}", t.detach().cpu().float().contiguous().numpy()))
    return out


def meta_arrays(kv: SequenceKV, logits: torch.Tensor, ship_from: int, num_tokens: int,
                block_size_tokens: int) -> list[tuple[int, str, str, np.ndarray]]:
    """(layer, kind, name, array) sent after the layers: the linear states at the prompt's
    last full block boundary when the decode node can keep that prefix, then the logits for
    the first token and `snap_at`."""
    boundary = num_tokens // block_size_tokens * block_size_tokens
    snap_at = boundary if ship_from < boundary < num_tokens else 0
    out = [(layer, "linear", name, a) for layer, name, a in snapshot_arrays(kv, snap_at)
           ] if snap_at else []
    out.append((META_LAYER, "none", "logits",
                logits.detach().float().cpu().contiguous().numpy()))
    out.append((META_LAYER, "none", "snap_at", np.array([snap_at], dtype=np.int64)))
    return out


def _is_linear(store: object) -> bool:
    return type(store).__name__ == "LinearStore"


@dataclass(slots=True)
class ShippedKV:
    layers: list[LayerKV]
    logits: torch.Tensor
    snap_at: int
    snapshots: dict[int, dict[str, torch.Tensor]]  # linear layer -> state at snap_at
    num_bytes: int


def read_shipped(received: ReceivedKV, num_layers: int) -> ShippedKV:
    """Rebuild the layers and metadata; a missing or inconsistent piece is a TransportError."""
    meta = received.layers.get(META_LAYER, {})
    if "logits" not in meta or "snap_at" not in meta:
        raise TransportError(f"request {received.request_id}: no logits/snap_at meta frame")
    layers: list[LayerKV] = []
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    for i in range(num_layers):
        arrays = received.layers.get(i)
        if arrays is None or "range" not in arrays:
            raise TransportError(f"request {received.request_id}: layer {i} missing")
        start, end = (int(v) for v in arrays["range"])
        wire = {n: a for n, a in arrays.items() if n != "range" and not n.startswith("snap.")}
        plain = sorted(decode_arrays(wire).items())
        layers.append(layer_kv_from_arrays(i, received.kinds[i], start, end, plain))
        snap = {n[5:]: torch.from_numpy(np.array(a)) for n, a in arrays.items()
                if n.startswith("snap.")}
        if snap:
            snapshots[i] = snap
    logits = torch.from_numpy(np.array(meta["logits"], dtype=np.float32))
    return ShippedKV(layers, logits, int(meta["snap_at"][0]), snapshots, received.num_bytes)
