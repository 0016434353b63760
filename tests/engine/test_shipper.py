"""The layer shipper on a fake asynchronous device (tests/engine/fake_device.py), and on CPU.

What must hold: the bytes the sender gets equal a direct copy of the request's blocks taken
after the forward (and a copy stream that skips its wait on the layer does not: the check can
fail); the model thread issues a whole forward while the device has run none of it, and waits
on nothing (the naive `.cpu()` per layer fails this same test: it is the negative control);
a full ring sends the request after the forward, counted, without a stall; a failed copy fails
its ticket, never hands over partial bytes; a pinned allocation that fails falls back to
pageable memory with a warning and a metric, still without a model-thread wait.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fake_device import FakeAsyncDevice

from prfaas.engine.device_ops import CpuOps
from prfaas.engine.host_ring import HostRing
from prfaas.engine.shipper import BlockingShipper, LayerShipper, ShipError, Ticket

LAYERS, NUM_BLOCKS, BS, WIDTH = 6, 24, 16, 36  # a paged cache [layer, block, BS, WIDTH] bf16
IDS = [7, 2, 19, 4, 11]  # the request's blocks, scattered in the pool
STATE = (4, 8, 8)  # the request's final linear-attention state (float32), shipped once
LAYER_BYTES = len(IDS) * BS * WIDTH * 2
ISSUE_TIMEOUT_S = 5.0  # a path that never waits issues 7 tensors in microseconds


class Model:
    """A forward on the fake device: each layer's compute writes the request's KV into the
    paged cache (on the compute stream, later); the model thread ships it right after."""

    def __init__(self, device: Any, seed: int = 0) -> None:
        self.device = device
        self.cache = torch.zeros(LAYERS, NUM_BLOCKS, BS, WIDTH, dtype=torch.bfloat16)
        self.state = torch.zeros(STATE)
        self.gen = torch.Generator().manual_seed(seed)
        self.idx = torch.tensor(IDS)
        self.tickets: list[Ticket] = []

    def _write(self, i: int) -> None:
        values = torch.randn(len(IDS), BS, WIDTH, generator=self.gen).to(torch.bfloat16)
        self.cache[i].index_copy_(0, self.idx, values)

    def forward(self, shipper: Any, request: str = "r1", end: bool = True) -> None:
        for i in range(LAYERS):
            self.device.launch(lambda i=i: self._write(i))
            self.tickets.append(shipper.ship(
                request, lambda i=i: self.cache[i].index_select(0, self.idx),
                (len(IDS), BS, WIDTH), torch.bfloat16, keep=(self.cache,)))
        self.device.launch(lambda: self.state.copy_(torch.randn(STATE, generator=self.gen)))
        self.tickets.append(shipper.ship(request, lambda: self.state.clone(), STATE,
                                         torch.float32, keep=(self.state,)))
        if end:
            shipper.end_step()
            shipper.end_request(request)

    def direct(self) -> list[torch.Tensor]:
        """A direct copy of what was shipped, taken after the device ran everything."""
        self.device.drain()
        return [self.cache[i].index_select(0, self.idx).clone() for i in range(LAYERS)] + [
            self.state.clone()]


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _on_thread(name: str, fn: Any, *args: Any) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, name=name, daemon=True)
    t.start()
    return t


def _sender(tickets: list[Ticket]) -> list[torch.Tensor]:
    """The sender's thread: waits on each ticket in order."""
    out: list[torch.Tensor] = []
    t = _on_thread("sender", lambda: out.extend(tk.wait() for tk in tickets))
    t.join(timeout=30)
    assert not t.is_alive(), "the sender never got its bytes"
    return out


@pytest.fixture
def held() -> Iterator[FakeAsyncDevice]:
    device = FakeAsyncDevice(hold=True)
    yield device
    device.stop()


def test_the_sender_gets_the_bytes_of_a_direct_copy(held: FakeAsyncDevice) -> None:
    model = Model(held)
    shipper = LayerShipper(held, ring_bytes=8 * LAYER_BYTES)
    model.forward(shipper)
    held.open()
    got = _sender(model.tickets)
    want = model.direct()
    assert len(got) == LAYERS + 1
    assert all(_same_bytes(g, w) for g, w in zip(got, want, strict=True))
    assert all(w.abs().sum() > 0 for w in want)  # (not comparing zeros)
    assert shipper.metrics.ring_full_requests == 0 and shipper.metrics.deferred_tickets == 0
    assert shipper.metrics.staged_bytes == LAYERS * LAYER_BYTES + 4 * 8 * 8 * 4
    assert shipper.ring is not None and shipper.ring.used_bytes == 0  # every slot given back


def test_a_copy_that_does_not_wait_for_the_layer_gets_other_bytes() -> None:
    """Negative control of the bytes check: a copy stream that skips its wait on the layer's
    event reads the cache before the compute wrote it."""
    device = FakeAsyncDevice(hold=True, skip_waits=True)
    try:
        model = Model(device)
        model.forward(LayerShipper(device, ring_bytes=8 * LAYER_BYTES))
        got = _sender(model.tickets)  # the copies ran while the compute was held
        device.open()
        want = model.direct()
        assert not any(_same_bytes(g, w) for g, w in zip(got, want, strict=True))
    finally:
        device.stop()


@pytest.mark.parametrize("path", [
    "shipper",
    pytest.param("naive", marks=pytest.mark.xfail(
        strict=True, reason="negative control: .cpu() per layer waits on the model thread")),
])
def test_the_model_thread_never_waits_on_a_transfer(held: FakeAsyncDevice, path: str) -> None:
    model = Model(held)
    shipper = (LayerShipper(held, ring_bytes=8 * LAYER_BYTES) if path == "shipper"
               else BlockingShipper(held))
    forward = _on_thread("model", model.forward, shipper)
    forward.join(timeout=ISSUE_TIMEOUT_S)  # the device runs nothing until it is opened
    issued_while_held = not forward.is_alive()
    ran_before_open = held.compute.ran
    held.open()
    forward.join(timeout=30)
    got = _sender(model.tickets)
    assert all(_same_bytes(g, w) for g, w in zip(got, model.direct(), strict=True))
    assert issued_while_held, "the model thread waited for the device to run the forward"
    assert ran_before_open == 0
    assert held.waits_of("model") == []
    assert held.waits_of("sender")  # the waiting happened, on the sender's thread


def test_a_full_ring_sends_the_request_after_the_forward_counted_never_stalling(
        held: FakeAsyncDevice) -> None:
    model = Model(held)
    shipper = LayerShipper(held, ring_bytes=2 * LAYER_BYTES + LAYER_BYTES // 2)
    forward = _on_thread("model", model.forward, shipper, "r1", False)
    forward.join(timeout=ISSUE_TIMEOUT_S)
    assert not forward.is_alive(), "a full ring stalled the model thread"
    assert shipper.metrics.ring_full_requests == 1
    # two layers fit; the third found no room, and the request stays on the fallback after it
    assert [tk.deferred for tk in model.tickets] == [False, False] + [True] * (LAYERS - 1)
    assert shipper.metrics.deferred_tickets == LAYERS - 1
    held.open()
    first = _sender(model.tickets[:2])
    late: list[torch.Tensor] = []
    waiter = _on_thread("sender", lambda: late.extend(tk.wait() for tk in model.tickets[2:]))
    waiter.join(timeout=0.5)
    assert waiter.is_alive() and not late, "a deferred tensor went before the forward's end"
    _on_thread("model", shipper.end_step).join(timeout=ISSUE_TIMEOUT_S)
    waiter.join(timeout=30)
    want = model.direct()
    assert all(_same_bytes(g, w) for g, w in zip(first + late, want, strict=True))
    assert held.waits_of("model") == []
    # the next request finds the ring empty again and streams layer by layer
    shipper.end_request("r1")
    again = Model(held, seed=1)
    again.forward(shipper, "r2")
    assert not any(tk.deferred for tk in again.tickets[:2])
    assert shipper.metrics.ring_full_requests == 2  # r2 (7 tensors) does not fit either
    got = _sender(again.tickets)
    assert all(_same_bytes(g, w) for g, w in zip(got, again.direct(), strict=True))


def test_a_failed_copy_fails_its_request_and_hands_over_no_bytes() -> None:
    device = FakeAsyncDevice(fail_copy=3)
    try:
        model = Model(device)
        shipper = LayerShipper(device, ring_bytes=8 * LAYER_BYTES)
        model.forward(shipper)
        outcomes: list[str] = []
        for tk in model.tickets:
            try:
                tk.wait()
                outcomes.append("ok")
            except ShipError as exc:
                outcomes.append(str(exc))
        assert outcomes[:2] == ["ok", "ok"] and outcomes[3:] == ["ok"] * (LAYERS - 2)
        assert "r1" in outcomes[2] and "fake DMA fault" in outcomes[2]
        with pytest.raises(ShipError):  # asked again: the same failure, never stale bytes
            model.tickets[2].wait()
        assert shipper.metrics.failed_tickets == 1
        assert shipper.ring is not None and shipper.ring.used_bytes == 0
    finally:
        device.stop()


def test_a_gather_that_raises_on_the_cpu_fails_its_ticket() -> None:
    shipper = LayerShipper(CpuOps())

    def broken() -> torch.Tensor:
        raise IndexError("block 99 out of range")

    ticket = shipper.ship("r1", broken, (2,), torch.float32)
    with pytest.raises(ShipError, match="block 99"):
        ticket.wait()
    assert shipper.metrics.failed_tickets == 1


def test_a_pinned_allocation_that_fails_falls_back_to_pageable_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    device = FakeAsyncDevice(hold=True, pin_fails=True)
    try:
        with caplog.at_level(logging.WARNING, logger="prfaas.engine.shipper"):
            shipper = LayerShipper(device, ring_bytes=8 * LAYER_BYTES)
        assert shipper.metrics.pinned_fallbacks == 1 and shipper.pageable
        assert "pinned host memory could not be allocated" in caplog.text
        model = Model(device)
        forward = _on_thread("model", model.forward, shipper)
        forward.join(timeout=ISSUE_TIMEOUT_S)
        assert not forward.is_alive()
        device.open()
        got = _sender(model.tickets)
        assert all(_same_bytes(g, w) for g, w in zip(got, model.direct(), strict=True))
        assert device.waits_of("model") == []
        assert all(w.startswith("event to_host") for w in device.waits_of("sender"))
        assert shipper.metrics.deferred_tickets == LAYERS + 1
    finally:
        device.stop()


def test_on_the_cpu_the_same_object_copies_directly() -> None:
    cache = torch.randn(LAYERS, NUM_BLOCKS, BS, WIDTH).to(torch.bfloat16)
    idx = torch.tensor(IDS)
    shipper = LayerShipper(CpuOps())
    tickets = [shipper.ship("r", lambda i=i: cache[i].index_select(0, idx),
                            (len(IDS), BS, WIDTH), torch.bfloat16) for i in range(LAYERS)]
    assert shipper.ring is None and all(tk.done() for tk in tickets)
    for i, tk in enumerate(tickets):
        assert _same_bytes(tk.wait(), cache[i].index_select(0, idx))


def test_the_ring_hands_out_in_order_reclaims_in_order_and_wraps() -> None:
    ring = HostRing(torch.zeros(1024, dtype=torch.uint8))
    a, b, c = ring.reserve(300), ring.reserve(300), ring.reserve(300)
    assert a is not None and b is not None and c is None  # 512 + 512 (aligned) fill it
    ring.release(b)  # given back early: still taken until `a` goes
    assert ring.used_bytes == 1024 and ring.reserve(10) is None
    ring.release(a)
    assert ring.used_bytes == 0
    d = ring.reserve(600)
    assert d is not None and d.offset == 0 and ring.view(d).numel() == 600
    e = ring.reserve(200)  # 768 + 256 = 1024: the head is back at 0
    assert e is not None and e.offset == 768
    ring.release(d)
    f = ring.reserve(300)
    assert f is not None and f.offset == 0  # head 512
    ring.release(e)
    g = ring.reserve(600)  # 768 bytes: not before the end (512 left there): wraps to 0
    assert g is None  # ... where `f` still is
    ring.release(f)
    g = ring.reserve(600)
    assert g is not None and g.offset == 0
    h = ring.reserve(100)
    assert h is not None and h.offset == 768
    ring.release(g)
    k = ring.reserve(700)  # 768 from 0 (the 0 bytes after `h` are skipped)
    assert k is not None and k.offset == 0 and ring.used_bytes == 1024
    ring.release(h)
    assert ring.used_bytes == 768
    assert ring.reserve(2000) is None
    ring.release(k)
    x, y = ring.reserve(512), ring.reserve(256)
    assert x is not None and y is not None and y.offset == 512
    ring.release(x)
    z = ring.reserve(512)  # 256 left before the end: skipped, the slot wraps to 0
    assert z is not None and z.offset == 0 and ring.used_bytes == 1024
    ring.release(y)
    assert ring.used_bytes == 768  # `z` and the 256 bytes it skipped
