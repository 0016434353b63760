"""`RequestLog`: what happened to each request of a run, column by column (plain lists,
indexed by request number, so the event loop appends and reads without objects)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestLog:
    """Per-request times (absolute seconds; nan where a stage never happened)."""

    arrival_s: list[float]
    input_tokens: list[int]
    output_tokens: list[int]
    remote: list[bool]
    rejected: list[bool]
    threshold_tokens: list[int]  # router's t when decided (-1: none)
    prefill_start_s: list[float]
    prefill_end_s: list[float]
    kv_ready_s: list[float]  # = first token at the decoder (TTFT end; + the route overhead)
    finish_s: list[float]
    kv_bytes: list[float]
    flow_start_s: list[float]  # remote transfers: joined the link
