"""When a prefill hands its KV to the link: which bytes a transfer can send, and from when.

Without a release model (`SystemConfig.kv_release` None) a pipelined transfer follows the
paper's layer-by-layer streaming: every layer leaves as it is computed, so at prefill end only
the last layer's share (kv_bytes / kv_layers) is left to send (simulator.py).

An engine that prefills a long prompt in chunks and keeps recurrent state releases its KV
differently. vLLM with a hybrid model (PrfaasConnector, integrations/vllm/worker_half.py): each
step computes one chunk of `chunk_tokens` tokens (`max_num_batched_tokens`); during that step
each full-attention layer saves the chunk's KV for that layer when it runs (`save_kv_layer`),
and the GDN/Mamba layers' conv and recurrent state (`state_bytes`, one per sequence) is sent
only after the prompt's last step (`wait_for_save`). So the KV becomes available in pieces:
  chunk k (tokens [p_k, p_k + c_k)), save point (fraction f, share s):
      available at start + D * (p_k + f * c_k) / l, bytes (kv_bytes - state) * s * c_k / l
  the state: available at start + D (prefill end), state bytes
with D the prefill's duration (as run: core sharing stretches it) and the chunk's compute
taken as proportional to its tokens. A save point's fraction is where in a chunk's forward its
layers' KV is saved: for an attention layer at index i of L, (i + 1/2) / L (the attention op
runs in the first half of its layer, the MLP after it; layers taken as equally long).
A transfer sent at `rate` from its first piece on cannot be complete before
    max over pieces j of (available_j + bytes of pieces j.. / rate)
(each piece has to wait for itself, and everything after it follows it through the same
pipe). `ready_s` is that bound; the simulator takes the later of it and the flow's own
bandwidth-limited finish on the shared link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prfaas.core.errors import ConfigError


@dataclass(frozen=True)
class KvRelease:
    chunk_tokens: int
    state_bytes: float
    # (fraction of a chunk's compute, share of the per-token bytes) per saving layer
    save_points: tuple[tuple[float, float], ...] = ((1.0, 1.0),)

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1:
            raise ConfigError("link.release.chunk_tokens", self.chunk_tokens, "must be >= 1")
        if not self.state_bytes >= 0:
            raise ConfigError("link.release.state_bytes", self.state_bytes, "must be >= 0")
        if not self.save_points:
            raise ConfigError("link.release.save_points", self.save_points,
                              "need at least one [fraction, share]")
        for f, s in self.save_points:
            if not (0.0 < f <= 1.0 and s > 0.0):
                raise ConfigError("link.release.save_points", self.save_points,
                                  "each needs 0 < fraction <= 1 and share > 0")
        total = sum(s for _, s in self.save_points)
        if abs(total - 1.0) > 1e-6:
            raise ConfigError("link.release.save_points", self.save_points,
                              f"shares must add up to 1 (they add up to {total:g})")

    def pieces(self, tokens: int, kv_bytes: float, start_s: float, end_s: float
               ) -> list[tuple[float, float]]:
        """(available_s, bytes) of each piece, in the order they become available."""
        duration = end_s - start_s
        state = min(self.state_bytes, kv_bytes)
        per_token = (kv_bytes - state) / tokens if tokens > 0 else 0.0
        out: list[tuple[float, float]] = []
        done = 0
        while done < tokens:
            c = min(self.chunk_tokens, tokens - done)
            for f, s in sorted(self.save_points):
                out.append((start_s + duration * (done + f * c) / tokens, per_token * s * c))
            done += c
        out.append((end_s, state))
        return out

    def ready_s(self, tokens: int, kv_bytes: float, start_s: float, end_s: float,
                rate_bps: float) -> float:
        """The earliest time the whole KV can be across at `rate_bps` (module docstring)."""
        pieces = self.pieces(tokens, kv_bytes, start_s, end_s)
        bound, behind = end_s, 0.0
        for at, size in reversed(pieces):  # `behind`: the bytes of this piece and those after
            behind += size
            bound = max(bound, at + behind / rate_bps)
        return bound

    def describe(self) -> dict[str, Any]:
        return {"chunk_tokens": self.chunk_tokens, "state_bytes": self.state_bytes,
                "save_points": [list(p) for p in self.save_points]}


def parse_release(raw: Any) -> KvRelease | None:
    """`link.release` of a scenario: {chunk_tokens, state_bytes, save_points} or absent."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError("link.release", raw,
                          "expected {chunk_tokens, state_bytes, save_points}")
    unknown = set(raw) - {"chunk_tokens", "state_bytes", "save_points"}
    if unknown:
        raise ConfigError("link.release", sorted(unknown),
                          "unknown keys (chunk_tokens, state_bytes, save_points)")
    try:
        points = tuple((float(f), float(s)) for f, s in raw.get("save_points", [[1.0, 1.0]]))
        return KvRelease(int(raw["chunk_tokens"]), float(raw.get("state_bytes", 0.0)), points)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError("link.release", raw,
                          f"expected chunk_tokens (int), state_bytes (bytes) and save_points "
                          f"([[fraction, share], ...]): {e}") from e


def save_points_of(layer_types: list[str]) -> tuple[tuple[float, float], ...]:
    """Where in a chunk's forward each full-attention layer saves its KV (module docstring):
    (i + 1/2) / L for layer i of L, an equal share each. No attention layer: one point at the
    end (nothing per token is sent)."""
    n = len(layer_types)
    at = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    if not at or n == 0:
        return ((1.0, 1.0),)
    return tuple(((i + 0.5) / n, 1.0 / len(at)) for i in at)
