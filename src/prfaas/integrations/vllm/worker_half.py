"""PrfaasConnector's worker half (runs in vLLM's Worker process, beside the model).

Producer: `save_kv_layer` (called by each attention layer during the forward) copies the blocks
the step completed out of that layer's paged cache and queues them on the sender thread, so the
layer leaves while the next one computes (in fp8 with its scales when the link's `wire_dtype`
or the request asks for it, wire_quant.py: the manifest and the byte count then see the codes
and scales as they travel); `wait_for_save` adds, on the prompt's last step, each
Mamba/GDN layer's state slot and the END, which carries the transfer's manifest (every tensor's
SHA-256, kv_security.py). A `meta` tensor opens every transfer: token count, prompt fingerprint
and cache-layout fingerprint, which the consumer checks.
Consumer: a receiver thread scatters each arriving tensor into the destination blocks (tensors
that arrive before the scheduler assigned them are held; fp8 codes wait for their scales, then
are dequantized into the cache dtype); a transfer ends as received only when
the wire says complete AND every block and state it needed was written, the manifest verifies
and every check passed. With the topology's TLS every KV connection is mutual TLS.
Anything else (peer gone, corrupt frame, timeout, mismatch) is a failed load: vLLM finishes the
request with an error, and the router retries it elsewhere.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from prfaas.core.errors import TransportError
from prfaas.engine.device_ops import device_ops
from prfaas.engine.shipper import DEFAULT_RING_BYTES, LayerShipper, Ticket
from prfaas.integrations.vllm import kv_security as sec
from prfaas.integrations.vllm.blocks import (
    WIRE_CONV_LAYOUT,
    block_dim,
    conv_bytes,
    conv_from_wire,
    conv_to_wire,
    from_wire,
    scatter,
    state_parts,
    to_wire,
)
from prfaas.integrations.vllm.cpu_layout import with_cpu_page_order
from prfaas.integrations.vllm.link import Abort, Finish, RecvLink, SendLink, Staged, Tensor
from prfaas.integrations.vllm.metadata import LoadJob, PrfaasMetadata, SaveJob
from prfaas.integrations.vllm.params import FP8, connector_wire_dtype
from prfaas.integrations.vllm.wire_quant import (
    BlockLayout,
    decode_blocks,
    encode_blocks,
    int4_control,
)
from prfaas.transport.quant import SCALE_SUFFIX
from prfaas.transport.receiver import ReceiverConfig
from prfaas.transport.sender import SenderConfig

META = "meta"
_LAYER = re.compile(r"layers\.(\d+)\.")

log = logging.getLogger(__name__)


def layer_index(name: str, fallback: int) -> int:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else fallback


def _optional_float(raw: object) -> float | None:
    return None if raw is None else float(raw)  # type: ignore[arg-type]


def _optional_int(raw: object) -> int | None:
    return None if raw is None else int(raw)  # type: ignore[call-overload]


@dataclass(slots=True)
class _Incoming:
    job: LoadJob | None = None
    held: list[tuple[int, str, np.ndarray]] = field(default_factory=list)
    blocks: dict[int, set[int]] = field(default_factory=dict)  # layer -> block indexes written
    states: set[int] = field(default_factory=set)  # layers whose state was written
    ledger: sec.Ledger = field(default_factory=sec.Ledger)  # every tensor received, digested
    meta_ok: bool = False
    error: str | None = None
    first_s: float | None = None
    nbytes: int = 0  # payload bytes received (every tensor of the transfer, meta included)
    # fp8 blocks whose codes or scale has not arrived yet: (layer, name) -> {name: array}
    halves: dict[tuple[int, str], dict[str, np.ndarray]] = field(default_factory=dict)


def _vllm_conv_layout() -> str:
    """This process's Mamba conv-state layout, "SD" or "DS" (vLLM's own choice, env-driven)."""
    from vllm.model_executor.layers.mamba.mamba_utils import get_conv_state_layout

    return str(get_conv_state_layout())


class WorkerHalf:
    def __init__(self, kv_cache_config: Any, extra: dict[str, Any], producer: bool,
                 consumer: bool, model_id: str = "") -> None:
        self.config = kv_cache_config
        self.model_id = model_id
        tls = sec.ConnectorTls.from_extra(extra)  # a bad certificate fails the start here
        self._ledgers: dict[int, sec.Ledger] = {}  # producer: per transfer, as queued
        self._faults: dict[int, str] = {}  # producer: test faults (kv_security.take_fault)
        self._last_nonce = ""
        self._fault_file = extra.get("fault_file")
        self.groups = kv_cache_config.kv_cache_groups
        self.group_of: dict[str, int] = {n: g for g, grp in enumerate(self.groups)
                                         for n in grp.layer_names}
        self.caches: dict[str, Any] = {}
        self.index_of: dict[str, int] = {}
        self.name_of: dict[int, str] = {}
        self.fp8_layouts: dict[str, BlockLayout | None] = {}
        self._fingerprint = 0  # set by register()
        self._trace_path = extra.get("trace_path")
        self._trace_lock = threading.Lock()
        self.send: SendLink | None = None
        self.recv: RecvLink | None = None
        self.shipper: LayerShipper | None = None  # producer: made when the caches are known
        self._ring_bytes = int(extra.get("ship_ring_bytes", DEFAULT_RING_BYTES))
        self._lock = threading.Lock()
        self._incoming: dict[int, _Incoming] = {}
        self._reported: set[int] = set()
        self._aborted_reqs: set[str] = set()
        self._meta_sent: set[int] = set()
        self._held: dict[int, list[Staged]] = {}  # after_prefill transfers' tensors
        self.conv_layout = str(extra.get("conv_state_layout") or _vllm_conv_layout())
        self._last_conv: dict[int, torch.Tensor] = {}  # layer -> last conv received (bytes)
        self._queued_bytes: dict[int, int] = {}  # transfer -> payload bytes queued so far
        self._sent_bytes: dict[str, int] = {}  # finished prefills' totals, until reported
        # consumer: loads that finished valid -> the wire bytes they took, until reported
        self._received_wire_bytes: dict[str, int] = {}
        # full-attention KV on the wire (the topology link's `wire_dtype`; None: as cached)
        self.wire_dtype = connector_wire_dtype(extra.get("wire_dtype"),
                                               "kv_connector_extra_config.wire_dtype")
        if producer:
            rate = extra.get("rate_gbps")
            self.send = SendLink(SenderConfig(
                num_connections=int(extra.get("connections", 4)),
                rate_gbps=None if rate is None else float(rate),
                chunk_bytes=_optional_int(extra.get("chunk_bytes")),  # None: the sender's
                compression=str(extra.get("compression", "none")),
                link_rate_gbps=_optional_float(extra.get("link_rate_gbps"))),
                tls=tls.client() if tls else None, peer_name=tls.decoder_name if tls else None)
        if consumer:
            self.recv = RecvLink(ReceiverConfig(
                host=str(extra.get("kv_host", "127.0.0.1")), port=int(extra["kv_port"]),
                # a connection of an open transfer may idle while the prefill computes (layer-wise
                # over a long, chunked prompt); the request's own timeout bounds the whole wait
                frame_timeout_s=float(extra.get("frame_timeout_s", 300.0))), self._on_tensor,
                tls=tls.server() if tls else None, accept_peer=tls.accept if tls else None)

    # -- setup --------------------------------------------------------------------------
    def register(self, kv_caches: dict[str, Any]) -> None:
        self.caches = dict(kv_caches)
        if self.send is not None:  # the caches' device decides how layers leave it
            device = next((t.device for c in self.caches.values() for t in state_parts(c)),
                          None)
            self.shipper = LayerShipper(device_ops(device), self._ring_bytes)
        for i, name in enumerate(sorted(kv_caches)):
            self.index_of[name] = layer_index(name, i)
        self.name_of = {i: n for n, i in self.index_of.items()}
        self.fp8_layouts = self._fp8_layouts()
        self._fingerprint = self._layout_fingerprint()

    def _fp8_layouts(self) -> dict[str, BlockLayout | None]:
        """Each attention layer's layout for fp8 on the wire (None: a cache it cannot quantize,
        which then travels as cached); with the instance's wire dtype fp8 such a cache fails
        the start, not a request's forward."""
        out: dict[str, BlockLayout | None] = {}
        read: dict[tuple[BlockLayout, torch.dtype], BlockLayout] = {}  # one probe per kind
        for name, cache in self.caches.items():
            g = self.group_of.get(name)
            spec = self.groups[g].kv_cache_spec if g is not None else None
            if spec is None or hasattr(spec, "shapes") or not isinstance(cache, torch.Tensor):
                continue  # not an attention layer (GDN states keep their dtype)
            try:
                layout = BlockLayout.of(spec)
                layout.check(cache, self._dim(cache))
                if self._dim(cache) == 0 and cache.device.type == "cpu":
                    key = (layout, cache.dtype)
                    if key not in read:
                        read[key] = with_cpu_page_order(layout, cache.dtype)
                    layout = read[key]
                out[name] = layout
            except (TransportError, AttributeError) as exc:
                if self.wire_dtype == FP8:
                    raise TransportError(f"wire_dtype {FP8}: layer {name}: {exc}") from exc
                log.warning("layer %s crosses as cached only; an fp8 transfer to it fails: %s",
                            name, exc)
                out[name] = None
        return out

    def layout_fingerprint(self) -> int:
        """The caches' layout as both ends must share it (fixed once the caches register)."""
        return self._fingerprint

    def _layout_fingerprint(self) -> int:
        parts = [f"conv-wire:{WIRE_CONV_LAYOUT}"]
        for name in sorted(self.caches):
            for t in state_parts(self.caches[name]):
                parts.append(f"{self.index_of[name]}:{tuple(t.shape[1:])}:{t.dtype}")
            layout = self.fp8_layouts.get(name)
            if layout is not None and layout.page_order is not None:
                # blocks also cross as cached (bf16): both ends must order a page alike
                parts.append(f"page:{zlib.crc32(layout.page_order.tobytes())}")
        return zlib.crc32(";".join(parts).encode())

    def layer_sets(self) -> dict[str, list[int]]:
        """The model's layers as the manifest lists them: attention (blocks), GDN (states)."""
        out: dict[str, list[int]] = {"blocks": [], "states": []}
        for name in self.caches:
            g = self.group_of.get(name)
            if g is not None:
                kind = "states" if hasattr(self.groups[g].kv_cache_spec, "shapes") else "blocks"
                out[kind].append(self.index_of[name])
        return out

    def _head(self, tid: int, nonce: str, num_tokens: int, tokens: str,
              model: str | None = None) -> dict[str, Any]:
        return sec.head(tid, nonce, self.model_id if model is None else model,
                        self.layer_sets(), num_tokens, tokens)

    def _conv_spec(self, g: int) -> tuple[tuple[int, ...], torch.dtype]:
        spec = self.groups[g].kv_cache_spec
        return tuple(spec.shapes[0]), spec.dtypes[0]

    def _fp8_layout(self, layer: int) -> BlockLayout:
        layout = self.fp8_layouts.get(self.name_of[layer])
        if layout is None:
            raise TransportError(f"fp8 blocks arrived for layer {self.name_of[layer]}, whose "
                                 "cache this instance cannot quantize")
        return layout

    def _dim(self, t: torch.Tensor) -> int:
        return block_dim(t, self.config.num_blocks)

    def trace(self, **event: Any) -> None:
        if self._trace_path:
            line = json.dumps({"t": time.monotonic(), **event})
            with self._trace_lock, open(self._trace_path, "a") as f:
                f.write(line + "\n")

    # -- producer -----------------------------------------------------------------------
    def save_layer(self, meta: PrfaasMetadata, layer_name: str, kv_layer: torch.Tensor) -> None:
        """save_kv_layer (model thread): the step's new blocks of this layer start toward the
        host through the shipper; converting, digesting and sending happen beside the sender."""
        assert self.send is not None and self.shipper is not None
        g = self.group_of.get(layer_name)
        if g is None:
            return
        layer = self.index_of[layer_name]
        dim = self._dim(kv_layer)
        for job in meta.saves:
            self._send_meta(job)
            ids, start = job.blocks[g]
            if not ids:
                continue
            shape = list(kv_layer.shape)
            shape[dim] = len(ids)
            ticket = self.shipper.ship(job.transfer_id,
                                       functools.partial(self._gather, kv_layer, ids, dim),
                                       tuple(shape), kv_layer.dtype, keep=(kv_layer,))
            wire = job.wire_dtype or self.wire_dtype
            layout = self.fp8_layouts.get(layer_name)
            if not (wire == FP8 and layout is not None and kv_layer.element_size() > 1):
                layout = None  # (1 byte: the cache is fp8 already)
            make = functools.partial(_block_items, ticket, job, layer, start, dim, layout)
            if layout is None:
                nbytes, first = ticket.nbytes, (ticket.nbytes // kv_layer.element_size(),
                                                kv_layer.element_size())
            else:  # fp8 codes (1 byte each, listed first) and their scales
                nbytes, first = layout.wire_nbytes(len(ids)), (layout.codes(len(ids)), 1)
            self._submit(job, make, nbytes, ticket.discard, first)
            self.trace(side="send", tid=job.transfer_id, ev="layer", layer=layer,
                       blocks=len(ids), bytes=nbytes)

    def _gather(self, cache: torch.Tensor, ids: list[int], dim: int) -> torch.Tensor:
        """The request's blocks of one layer (on the shipper's copy stream)."""
        assert self.shipper is not None
        return cache.index_select(dim, self.shipper.ops.index(ids, cache.device))

    def _send_meta(self, job: SaveJob) -> None:
        assert self.send is not None
        if not job.first or job.transfer_id in self._meta_sent:
            return
        self._meta_sent.add(job.transfer_id)
        self._ledgers[job.transfer_id] = sec.Ledger()
        fault = sec.take_fault(self._fault_file)
        if fault is not None:
            self._faults[job.transfer_id] = fault
        info = np.array([job.num_tokens, job.fingerprint, self.layout_fingerprint()], np.int64)
        item = Tensor(job.transfer_id, 0, META, info)
        self._submit(job, functools.partial(_as_list, item), int(info.nbytes))

    def _submit(self, job: SaveJob, make: Callable[[], list[Tensor]], nbytes: int,
                discard: Callable[[], None] | None = None,
                first: tuple[int, int] | None = None) -> None:
        """Queue what `make()` gives (in a thread beside the sender: it may wait for the
        device) for the transfer; `nbytes`: what it will be on the wire, counted now (the
        prefill's `kv_bytes` is reported with its last step). `first`: a block tensor's first
        array's (elements, bytes per element), for the truncate fault."""
        assert self.send is not None
        tid = job.transfer_id
        ledger = self._ledgers.setdefault(tid, sec.Ledger())
        truncate = first is not None and self._faults.get(tid) == "truncate"
        if truncate and first is not None:  # the first block tensor loses its second half
            del self._faults[tid]
            nbytes -= (first[0] - first[0] // 2) * first[1]
        staged = Staged(tid, functools.partial(_digested, make, ledger, truncate),
                        discard or _nothing)
        self._queued_bytes[tid] = self._queued_bytes.get(tid, 0) + nbytes
        if job.after_prefill:
            self._held.setdefault(tid, []).append(staged)
        else:
            self.send.submit(job.dest, staged, job.rate_gbps)

    def end_step(self, meta: PrfaasMetadata) -> None:
        """wait_for_save (model thread): on a prompt's last step, its recurrent states, then
        END. Waits for nothing: the compute stream waits, on the device, for the step's reads
        of the cache (shipper.end_step); the copies and the network are the sender's."""
        assert self.send is not None and self.shipper is not None
        for job in meta.saves:
            self._send_meta(job)
            if not job.last:
                continue
            fault = self._faults.pop(job.transfer_id, None)
            for name in sorted(self.caches, key=self.index_of.__getitem__):
                if fault == "drop_state":
                    break
                g = self.group_of.get(name)
                slot = job.state_blocks[g] if g is not None and job.state_blocks else None
                if g is None or slot is None:
                    continue
                self._ship_state(job, name, g, slot)
            for staged in self._held.pop(job.transfer_id, []):  # send-after-prefill baseline
                self.send.submit(job.dest, staged, job.rate_gbps)
            # the ledger is filled beside the sender; the manifest is encoded there after it
            ledger = self._ledgers.pop(job.transfer_id, sec.Ledger())
            manifest = functools.partial(self._manifest, job, fault, ledger)
            self.send.submit(job.dest, Finish(job.transfer_id, manifest), job.rate_gbps)
            self._meta_sent.discard(job.transfer_id)
            self._sent_bytes[job.req_id] = self._queued_bytes.pop(job.transfer_id, 0)
            self.shipper.end_request(job.transfer_id)
            self.trace(side="send", tid=job.transfer_id, ev="prefill_end")
        self.shipper.end_step()
        for tid, dest, rate in meta.abort_sends:
            for staged in self._held.pop(tid, []):  # given back beside the sender
                self.send.submit(dest, Staged(tid, _no_tensors, staged.discard), rate)
            self._ledgers.pop(tid, None)
            self._faults.pop(tid, None)
            self._meta_sent.discard(tid)
            self._queued_bytes.pop(tid, None)
            self.shipper.end_request(tid)
            self.send.submit(dest, Abort(tid, "the prefill request ended before its prompt"),
                             rate)
        for r in self.send.drain():
            self.trace(side="send", tid=r.transfer_id, ev="sent", error=r.error, done=r.done_s,
                       wire=r.wire_bytes)

    def _ship_state(self, job: SaveJob, name: str, g: int, slot: int) -> None:
        """A Mamba/GDN layer's final state slot, once per request (its conv part in the wire
        layout, converted on the device before the copy)."""
        assert self.shipper is not None
        layer = self.index_of[name]
        for k, part in enumerate(state_parts(self.caches[name])):
            conv = self._conv_spec(g) if k == 0 else None
            gather = functools.partial(_state_slot, part, slot, conv, self.conv_layout)
            ticket = self.shipper.ship(job.transfer_id, gather, (1, *part.shape[1:]),
                                       part.dtype, keep=(part,))
            make = functools.partial(_plain_items, ticket, job.transfer_id, layer, f"s{k}")
            self._submit(job, make, ticket.nbytes, ticket.discard)

    def _manifest(self, job: SaveJob, fault: str | None, ledger: sec.Ledger) -> bytes:
        """Beside the sender, after every tensor of the transfer was digested into `ledger`."""
        nonce = self._last_nonce if fault == "replay" else job.nonce
        self._last_nonce = job.nonce
        model = sec.other_model(self.model_id) if fault == "foreign_model" else None
        return ledger.encode(self._head(job.transfer_id, nonce, job.num_tokens,
                                        job.tokens_sha256, model))

    def take_sent_bytes(self) -> dict[str, int]:
        """The finished prefills' byte counts since the last call (build_connector_worker_meta)."""
        out, self._sent_bytes = self._sent_bytes, {}
        return out

    # -- consumer -----------------------------------------------------------------------
    def start_loads(self, meta: PrfaasMetadata) -> None:
        assert self.recv is not None
        for job in meta.loads:
            with self._lock:
                inc = self._incoming.setdefault(job.transfer_id, _Incoming())
                inc.job = job
                held, inc.held = inc.held, []
                for layer, name, array in held:
                    self._apply(inc, layer, name, array)
            # held: tensors that arrived before vLLM gave the request its blocks (kept aside)
            self.trace(side="recv", tid=job.transfer_id, ev="load", held=len(held))
            self.recv.expect(job.transfer_id, job.timeout_s)
        for tid in meta.aborted:
            with self._lock:
                gone = self._incoming.pop(tid, None)
                if gone is None or gone.job is None or tid in self._reported:
                    continue
                self._reported.add(tid)
                inc = gone
                self._aborted_reqs.add(gone.job.req_id)
            self.recv.forget(tid)

    def _on_tensor(self, tid: int, layer: int, name: str, array: np.ndarray) -> None:
        entry = sec.entry(array)  # the digest outside the lock (the engine thread takes it)
        with self._lock:
            inc = self._incoming.setdefault(tid, _Incoming())
            if inc.first_s is None:
                inc.first_s = time.monotonic()
            inc.ledger.tensors[(layer, name)] = entry
            if inc.job is None:
                inc.held.append((layer, name, array.copy()))
            else:
                self._apply(inc, layer, name, array)
        self.trace(side="recv", tid=tid, ev="tensor", layer=layer, name=name,
                   bytes=int(array.nbytes))

    def _apply(self, inc: _Incoming, layer: int, name: str, array: np.ndarray) -> None:
        """Write one tensor into the paged caches (holding the lock); errors fail the load."""
        job = inc.job
        assert job is not None
        if inc.error is not None:
            return
        try:
            if name == META:
                self._check_meta(job, array)
                inc.meta_ok = True
            elif name.startswith("b"):
                self._apply_blocks(inc, job, layer, name, array)
            elif name.startswith("s"):
                self._cache(layer)  # an unknown layer fails here
                g = self.group_of[self.name_of[layer]]
                slot = job.state_blocks[g]
                if slot is None:
                    raise ValueError(f"layer {layer} got a state but is not a Mamba layer")
                self._apply_state(job, layer, g, slot, int(name[1:]), array)
                inc.states.add(layer)
            else:
                raise ValueError(f"unknown tensor {name!r}")
            inc.nbytes += int(array.nbytes)
        except Exception as exc:
            inc.error = f"layer {layer} {name}: {type(exc).__name__}: {exc}"

    def _apply_state(self, job: LoadJob, layer: int, g: int, slot: int, k: int,
                     array: np.ndarray) -> None:
        parts = state_parts(self._cache(layer))
        part = parts[k]
        data = from_wire(array, part)
        shape, dtype = self._conv_spec(g)
        if k == 0:  # the conv state (in the wire layout) first in the slot
            n = conv_bytes(shape, dtype)
            foreign = self._last_conv.get(layer) if job.fault == "foreign_conv" else None
            self._last_conv[layer] = data.reshape(-1).view(torch.uint8)[:n].clone()
            if foreign is not None:  # another request's conv state, this one's SSM state
                data = data.clone()
                data.reshape(-1).view(torch.uint8)[:n] = foreign
            data = conv_from_wire(data, shape, dtype, self.conv_layout)
        if job.fault == "zero_state":  # everything but the conv state: the recurrent state
            if len(parts) == 1:
                data.reshape(-1).view(torch.uint8)[conv_bytes(shape, dtype):] = 0
            elif k > 0:
                data = torch.zeros_like(data)
        scatter(part, [slot], 0, data)

    def _cache(self, layer: int) -> Any:
        name = self.name_of.get(layer)
        if name is None:
            raise ValueError(f"layer {layer} is not a layer of this model")
        return self.caches[name]

    def _check_meta(self, job: LoadJob, array: np.ndarray) -> None:
        n, fp, layout = (int(v) for v in array.reshape(-1)[:3])
        if n != job.num_tokens:
            raise ValueError(f"sender computed {n} tokens, this request needs {job.num_tokens}")
        if fp != job.fingerprint:
            raise ValueError("prompt fingerprint differs: the KV is of another prompt")
        if layout != self.layout_fingerprint():
            raise ValueError("cache layout fingerprint differs: another model or cache config")

    def _apply_blocks(self, inc: _Incoming, job: LoadJob, layer: int, name: str,
                      array: np.ndarray) -> None:
        cache = self._cache(layer)
        g = self.group_of[self.name_of[layer]]
        spec = self.groups[g].kv_cache_spec
        bs = spec.block_size
        dim = self._dim(cache)
        base = name.removesuffix(SCALE_SUFFIX)
        start = int(base[1:])
        if name != base or (array.dtype == np.uint8 and cache.element_size() > 1):
            # fp8 on the wire: codes and scale travel apart (any connection, any order)
            pair = inc.halves.setdefault((layer, base), {})
            pair[name] = array.copy()  # the receive buffer is not ours past this call
            if len(pair) < 2:
                return
            del inc.halves[(layer, base)]
            if job.fault == "fp8_wrong_scale":
                pair[base + SCALE_SUFFIX] = pair[base + SCALE_SUFFIX] * 2
            data = decode_blocks(pair, base, self._fp8_layout(layer), dim, cache.dtype)
        else:
            data = from_wire(array, cache)
        if job.fault == "int4_kv":
            data = int4_control(data, dim, self._fp8_layout(layer))
        n = data.shape[dim]
        dest = job.block_ids[g][start : start + n]
        if len(dest) != n:
            raise ValueError(f"blocks {start}..{start + n} beyond the {len(job.block_ids[g])} "
                             "allocated")
        keep = [j for j in range(n) if start + j >= job.skip_tokens // bs]
        if job.fault == "shift_blocks":  # block j into block j+1 (the last one is dropped)
            shifted = job.block_ids[g][start + 1 : start + 1 + n]
            keep = [j for j in keep if j < len(shifted)]
            dest = shifted
        if keep:
            scatter(cache, [dest[j] for j in keep], dim,
                    data.index_select(dim, torch.tensor(keep, dtype=torch.long)))
        inc.blocks.setdefault(layer, set()).update(range(start, start + n))

    def _complete(self, inc: _Incoming) -> str | None:
        """Why a wire-complete transfer is still not a valid load (None: it is)."""
        job = inc.job
        assert job is not None
        if inc.error is not None:
            return inc.error
        if not inc.meta_ok:
            return "no meta tensor: sender is not a matching prfaas connector"
        for name, g in self.group_of.items():
            spec = self.groups[g].kv_cache_spec
            layer = self.index_of.get(name)
            if layer is None:
                continue
            if job.state_blocks and job.state_blocks[g] is not None:
                if layer not in inc.states:
                    return f"layer {layer}: recurrent state missing"
                continue
            need = set(range(-(-job.num_tokens // spec.block_size)))
            missing = need - inc.blocks.get(layer, set())
            if missing:
                return f"layer {layer}: blocks {sorted(missing)[:4]} missing"
        return None

    def results(self) -> tuple[set[str], set[str]]:
        """(finished, failed) request ids since the last call: each transfer reported once."""
        assert self.recv is not None
        finished, failed = set(self._aborted_reqs), set()
        self._aborted_reqs.clear()
        for r in self.recv.drain():
            with self._lock:
                inc = self._incoming.pop(r.transfer_id, None)
                if inc is None or inc.job is None or r.transfer_id in self._reported:
                    continue
                self._reported.add(r.transfer_id)
                # the manifest first (it names a tampered field or tensor), then coverage
                expect = self._head(r.transfer_id, inc.job.nonce, inc.job.num_tokens,
                                    inc.job.tokens_sha256)
                why = (r.error or sec.verify(r.manifest, expect, inc.ledger)
                       or self._complete(inc))
            finished.add(inc.job.req_id)
            if why is not None:
                failed.add(inc.job.req_id)
            elif r.wire_bytes is not None:
                self._received_wire_bytes[inc.job.req_id] = r.wire_bytes
            self.trace(side="recv", tid=r.transfer_id, ev="done", error=why,
                       first=inc.first_s, done=r.done_s, bytes=inc.nbytes, wire=r.wire_bytes)
        return finished, failed

    def take_received_wire_bytes(self) -> dict[str, int]:
        """Loads finished valid since the last call: request id -> the bytes that crossed the
        link for it (compressed where they were; build_connector_worker_meta)."""
        out, self._received_wire_bytes = self._received_wire_bytes, {}
        return out

    def shutdown(self) -> None:
        for link in (self.send, self.recv):
            if link is not None:
                link.stop()


# -- what the sender's thread does with a staged tensor (link.Staged.resolve) ----------------
def _nothing() -> None:
    return None


def _no_tensors() -> list[Tensor]:
    return []


def _as_list(item: Tensor) -> list[Tensor]:
    return [item]


def _block_items(ticket: Ticket, job: SaveJob, layer: int, start: int, dim: int,
                 layout: BlockLayout | None) -> list[Tensor]:
    """One layer's gathered blocks as they travel: as cached, or fp8 codes and scales."""
    blocks = ticket.wait()
    if layout is None:
        array, bf16 = to_wire(blocks)
        return [Tensor(job.transfer_id, layer, f"b{start}", array, bf16)]
    return [Tensor(job.transfer_id, layer, name, array) for name, array in
            encode_blocks(blocks, dim, layout, job.num_tokens - start * layout.block_size,
                          f"b{start}")]


def _plain_items(ticket: Ticket, tid: int, layer: int, name: str) -> list[Tensor]:
    array, bf16 = to_wire(ticket.wait())
    return [Tensor(tid, layer, name, array, bf16)]


def _state_slot(part: torch.Tensor, slot: int, conv: tuple[tuple[int, ...], torch.dtype] | None,
                layout: str) -> torch.Tensor:
    """One state slot, a copy (the slot is reused once the request ends); part 0 (the conv
    state) in WIRE_CONV_LAYOUT."""
    data = part[slot : slot + 1]
    return conv_to_wire(data, *conv, layout) if conv is not None else data.clone()


def _digested(make: Callable[[], list[Tensor]], ledger: sec.Ledger, truncate: bool
              ) -> list[Tensor]:
    """`make()`'s tensors, each digested into the transfer's manifest (the truncate fault: the
    first one then loses its second half, the manifest listing it whole)."""
    out = []
    for item in make():
        ledger.add(item.layer, item.name, item.array)
        if truncate:
            truncate = False
            flat = item.array.reshape(-1)
            item = Tensor(item.transfer_id, item.layer, item.name, flat[: flat.size // 2],
                          item.bfloat16)
        out.append(item)
    return out
