"""The `kv_transfer_params` a router puts in the OpenAI body for PrfaasConnector (no vLLM here).

Both halves of one request carry the same `transfer_id` (the wire format's request id):
- to the prefill instance: `{"prfaas": {"role": "send", "transfer_id", "dest_host",
  "dest_port"}}`: compute the prompt and stream its KV to that receiver;
- to the decode instance: `{"prfaas": {"role": "recv", "transfer_id", "timeout_s"}}`: allocate
  the prompt's blocks and wait (asynchronously) for that transfer.
`fingerprint` binds a transfer to the prompt: both ends hash the token ids they hold.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from prfaas.core.errors import ConfigError
from prfaas.models.kv import wire_dtype_name

KEY = "prfaas"
FP8 = "fp8_e4m3"
# the wire dtypes PrfaasConnector encodes (wire_quant.py); otherwise the KV crosses as cached
# (bf16 for the CPU build's bf16 models: bf16 on the wire is then the cache dtype itself)
WIRE_DTYPES = (FP8,)


def connector_wire_dtype(value: object, where: str) -> str | None:
    """A wire dtype the connector encodes, canonical (`fp8` -> fp8_e4m3); None: as cached."""
    if value is None:
        return None
    name = wire_dtype_name(str(value))
    if name not in WIRE_DTYPES:
        raise ConfigError(where, value, f"PrfaasConnector encodes {', '.join(WIRE_DTYPES)}; "
                          "other KV travels as cached")
    return name


@dataclass(frozen=True, slots=True)
class SendParams:
    transfer_id: int
    dest_host: str
    dest_port: int
    # benchmark knobs (the router never sets them): another link rate than the instance's,
    # and send-after-prefill (every layer held until the prompt is done) instead of layer-wise
    rate_gbps: float | None = None
    after_prefill: bool = False
    nonce: str = ""  # the attempt's one-time value, bound into the manifest (kv_security.py)
    # this request's full-attention KV on the wire (WIRE_DTYPES), instead of the instance's
    # (its topology link's `wire_dtype`); a benchmark and test knob, the router never sets it
    wire_dtype: str | None = None

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"role": "send", "transfer_id": self.transfer_id,
                                "dest_host": self.dest_host, "dest_port": self.dest_port}
        if self.nonce:
            body["nonce"] = self.nonce
        if self.wire_dtype is not None:
            body["wire_dtype"] = self.wire_dtype
        if self.rate_gbps is not None:
            body["rate_gbps"] = self.rate_gbps
        if self.after_prefill:
            body["after_prefill"] = True
        return {KEY: body}


# Fault injection at the receiver, for negative controls (the router never sets it): the load
# completes as usual but writes wrong data, so a correctness check can be shown to fail.
# zero_state: every recurrent (SSM) state arrives zeroed; foreign_conv: the conv states are the
# previous transfer's (another request's); shift_blocks: KV block j is written to block j+1;
# int4_kv: every full-attention KV tensor goes through 4-bit integers with one scale per tensor
# (wire_quant.int4_control: the negative control of the fp8 wire's quality figure);
# fp8_wrong_scale: fp8 codes decoded with twice their scales (a wrong-scale quantizer; no effect
# on a transfer that is not fp8).
FAULTS = ("zero_state", "foreign_conv", "shift_blocks", "int4_kv", "fp8_wrong_scale")


@dataclass(frozen=True, slots=True)
class RecvParams:
    transfer_id: int
    timeout_s: float = 120.0
    fault: str | None = None  # one of FAULTS (tests only)
    # a resumed request: the last this many prompt tokens were its output (seed_offset.py)
    output_offset: int = 0
    nonce: str = ""  # the manifest must carry it (kv_security.py)

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"role": "recv", "transfer_id": self.transfer_id,
                                "timeout_s": self.timeout_s}
        if self.nonce:
            body["nonce"] = self.nonce
        if self.fault is not None:
            body["fault"] = self.fault
        if self.output_offset:
            body["output_offset"] = self.output_offset
        return {KEY: body}


def parse(params: object) -> SendParams | RecvParams | None:
    """The prfaas part of a request's kv_transfer_params; None when it has none."""
    if not isinstance(params, dict) or not isinstance(params.get(KEY), dict):
        return None
    p = params[KEY]
    try:
        tid = int(p["transfer_id"])
        if not 0 < tid < 2**63:
            raise ValueError(tid)
        if p.get("role") == "send":
            rate = p.get("rate_gbps")
            if rate is not None and not float(rate) > 0:
                raise ValueError(f"rate_gbps={rate}")
            wire = connector_wire_dtype(p.get("wire_dtype"),
                                        "kv_transfer_params.prfaas.wire_dtype")
            return SendParams(tid, str(p["dest_host"]), int(p["dest_port"]),
                              None if rate is None else float(rate), bool(p.get("after_prefill")),
                              _nonce(p), wire)
        if p.get("role") == "recv":
            fault = p.get("fault")
            if fault is not None and fault not in FAULTS:
                raise ValueError(f"fault={fault!r} (one of {', '.join(FAULTS)})")
            offset = int(p.get("output_offset", 0))
            if offset < 0:
                raise ValueError(f"output_offset={offset}")
            return RecvParams(tid, float(p.get("timeout_s", 120.0)), fault, offset, _nonce(p))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError("kv_transfer_params.prfaas", p, f"malformed: {exc}") from exc
    raise ConfigError("kv_transfer_params.prfaas.role", p.get("role"), "must be send or recv")


def _nonce(p: dict[str, Any]) -> str:
    nonce = p.get("nonce", "")
    if not isinstance(nonce, str) or len(nonce) > 128:
        raise ValueError(f"nonce={nonce!r} (a string of at most 128 characters)")
    return nonce


def fingerprint(token_ids: list[int]) -> int:
    """crc32 of the token ids (little-endian int32): binds a transfer to its prompt."""
    return zlib.crc32(b"".join(int(t).to_bytes(4, "little", signed=True) for t in token_ids))
