"""What the load generator sends: prompts and output lengths from a trace or a synthetic mix.

Mooncake rows carry `input_length`, `output_length` and `hash_ids` (chained ids of 512-token
blocks). A row becomes a byte-level prompt (1 byte = 1 token with the engine's tokenizer) made
of one pseudo-random block of text per hash id, so rows sharing ids share a real prefix and the
prefix caches see the trace's reuse. `length_scale` shrinks lengths for a CPU model: a block
becomes round(512 * scale) bytes and the lengths round(length * scale). Synthetic requests draw
lognormal lengths with no sharing. Everything is seeded; the same arguments give the same
requests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prfaas.core.errors import ConfigError, TraceError
from prfaas.core.files import read_text

TRACE_BLOCK_TOKENS = 512
_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class BenchRequest:
    # text: BOS is added by the native tokenizer, input tokens = len(prompt bytes) + 1; token
    # ids: sent as they are (any engine), input tokens = len(prompt)
    prompt: str | list[int]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Scaling:
    length_scale: float = 0.1
    max_output_tokens: int = 64
    max_input_tokens: int = 16000
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.length_scale <= 1:
            raise ConfigError("length_scale", self.length_scale, "must be in (0, 1]")
        if self.max_output_tokens < 1 or self.max_input_tokens < 2:
            raise ConfigError("max_output_tokens", self.max_output_tokens, "must be >= 1")


def _block_text(hash_id: int, num_bytes: int, seed: int) -> bytes:
    rng = np.random.default_rng([seed, hash_id])
    return _LETTERS[rng.integers(0, len(_LETTERS), size=num_bytes)].tobytes()


def from_mooncake_row(row: dict[str, object], scaling: Scaling) -> BenchRequest:
    block = max(1, round(TRACE_BLOCK_TOKENS * scaling.length_scale))
    hash_ids = row.get("hash_ids", [])
    assert isinstance(hash_ids, list)
    in_len = int(row["input_length"])  # type: ignore[call-overload]
    out_len = int(row["output_length"])  # type: ignore[call-overload]
    n_in = min(max(round(in_len * scaling.length_scale), 2), scaling.max_input_tokens) - 1
    text = b"".join(_block_text(int(h), block, scaling.seed) for h in hash_ids)
    if len(text) < n_in:  # the last id covers a partial block; pad deterministically
        text += _block_text(2**62 + len(text), n_in - len(text), scaling.seed)
    max_tokens = min(max(round(out_len * scaling.length_scale), 1), scaling.max_output_tokens)
    return BenchRequest(text[:n_in].decode("ascii"), max_tokens)


def read_mooncake(path: str | Path, scaling: Scaling, limit: int | None = None
                  ) -> list[BenchRequest]:
    p = Path(path)
    if not p.is_file():
        raise TraceError(str(path), None, "no such trace file")
    out: list[BenchRequest] = []
    for line_no, line in enumerate(read_text(p, "trace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(from_mooncake_row(row, scaling))
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            raise TraceError(str(path), line_no, f"not a Mooncake row: {exc}") from exc
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise TraceError(str(path), None, "no requests in the trace")
    return out


def synthetic(count: int, scaling: Scaling, mean_input_tokens: float = 12000.0,
              mean_output_tokens: float = 300.0) -> list[BenchRequest]:
    """Lognormal input/output lengths (sigma 0.8) around the given unscaled means."""
    rng = np.random.default_rng(scaling.seed)
    sigma = 0.8
    ins = rng.lognormal(np.log(mean_input_tokens) - sigma**2 / 2, sigma, size=count)
    outs = rng.lognormal(np.log(mean_output_tokens) - sigma**2 / 2, sigma, size=count)
    out = []
    for i, (n_in, n_out) in enumerate(zip(ins, outs, strict=True)):
        row = {"input_length": int(n_in), "output_length": int(n_out),
               "hash_ids": [10**9 + i * 1000 + b for b in range(int(n_in) // 512 + 1)]}
        out.append(from_mooncake_row(row, scaling))
    return out


def poisson_arrivals(rate_per_s: float, duration_s: float, seed: int) -> list[float]:
    if rate_per_s <= 0 or duration_s <= 0:
        raise ConfigError("rate", rate_per_s, "rate and duration must be positive")
    rng = np.random.default_rng(seed)
    times: list[float] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / rate_per_s))
        if t >= duration_s:
            return times
        times.append(t)
