"""What vLLM's KV events say for the hybrid tiny Qwen3-Next (3 GDN : 1 attention), CPU build.

One standalone instance of topologies/vllm-local.yaml's model and settings, with
`--kv-events-config` (the router's own events_config) and a small cache (64 blocks,
`--num-gpu-blocks-override`, as the llama live test's pdp-0) so that evictions happen. A ZMQ
subscriber records every event; the router's translation (cache/block_events.EngineBlockIndex
into a GlobalKVCacheManager, exact lookups, as the router does with events) says how many
tokens of a prompt the router would count on the instance, in the topology's block size.
Steps: a 2,000-token prompt A; A again (vLLM's own cached_tokens); four 3,000-token prompts
(more than the cache holds); A again; eight more 3,000-token prompts (A is evicted); A again.
Writes benchmarks/results/vllm_hybrid_events.json: every event summarised (type, group, kind,
blocks, tokens, parent known), the router's count for each prompt before it is sent
(`router_counted_before_tokens`) beside vLLM's own `cached_tokens` for it, and the router's
count of A after each step. The router's index applies each ZMQ batch whole.

    flock /work/heavy.lock env PYTHONPATH=src .venv/bin/python \
        benchmarks/probe_vllm_hybrid_events.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integrations" / "vllm"))
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

BLOCKS = 64
OUT = ROOT / "benchmarks" / "results" / "vllm_hybrid_events.json"


def main() -> int:
    import zmq
    from vllm_live import post, prompts

    from prfaas.cache import GlobalKVCacheManager, chain_hashes
    from prfaas.cache.block_events import BlockStored, EngineBlockIndex
    from prfaas.integrations.vllm.kv_events import events_config, parse_batch
    from prfaas.integrations.vllm.model_builder import ensure_model
    from prfaas.integrations.vllm.reference import reference_spec
    from prfaas.integrations.vllm.server import VllmInstance
    from prfaas.serve.topology import free_port, load_topology

    root = Path(tempfile.mkdtemp(prefix="prfaas-hybrid-events-"))
    topo = load_topology(ROOT / "topologies" / "vllm-local.yaml")
    assert topo.vllm is not None
    model_dir = ensure_model("qwen3_next", root / "qwen3_next", seed=0)
    s = dataclasses.replace(topo.vllm, model_dir=str(model_dir))
    events_port = free_port()
    spec = reference_spec(s, free_port(), cores="0")
    spec = dataclasses.replace(spec, args=(
        *spec.args, "--num-gpu-blocks-override", str(BLOCKS),
        "--kv-events-config", json.dumps(events_config(f"tcp://*:{events_port}", "probe"))))
    bs = s.block_size_tokens
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"probe")
    sub.connect(f"tcp://127.0.0.1:{events_port}")
    manager = GlobalKVCacheManager(bs)
    manager.add_instance("probe", "pd")
    index = EngineBlockIndex("probe", manager, bs)
    summary: list[dict[str, Any]] = []
    known: set[Any] = set()
    steps: list[dict[str, Any]] = []

    def drain(quiet_s: float = 2.0) -> None:
        deadline = time.monotonic() + quiet_s
        while time.monotonic() < deadline:
            if not sub.poll(100):
                continue
            frames = sub.recv_multipart()
            events = parse_batch(frames[2])
            for ev in events:
                row: dict[str, Any] = {"type": type(ev).__name__}
                if isinstance(ev, BlockStored):
                    row.update(group=ev.group, kind=ev.kind, blocks=len(ev.block_hashes),
                               tokens=len(ev.token_ids), block_size=ev.block_size_tokens,
                               parent=None if ev.parent_hash is None else
                               ("known" if ev.parent_hash in known else "unknown"))
                    known.update(ev.block_hashes)
                elif hasattr(ev, "block_hashes"):
                    row.update(group=ev.group, blocks=len(ev.block_hashes))
                summary.append(row)
            index.apply_batch(events)  # whole, as the router's subscriber does
            deadline = time.monotonic() + quiet_s

    def counted(prompt: list[int]) -> int:
        return manager.match(chain_hashes(prompt, bs, 0), exact=True).cached_tokens("probe")

    def step(name: str, prompt: list[int], probe: list[int]) -> None:
        before = len(summary)
        predicted = counted(prompt)  # what the router counts for this prompt before sending it
        status, reply = post(spec.url, {"model": s.served_name, "prompt": prompt,
                                        "max_tokens": 1, "temperature": 0})
        assert status == 200, reply
        cached = ((reply.get("usage") or {}).get("prompt_tokens_details") or {}).get(
            "cached_tokens")
        drain()
        router = counted(probe)
        steps.append({"step": name, "prompt_tokens": len(prompt),
                      "router_counted_before_tokens": predicted,
                      "vllm_cached_tokens": cached, "router_counts_tokens_of_A": router,
                      "events": summary[before:], "stats": dataclasses.asdict(index.stats)})
        print(f"{name}: vllm cached {cached}, router counts {router} of A; "
              f"{len(summary) - before} events, stats {index.stats}", flush=True)

    with VllmInstance(spec, root / "vllm.log") as inst:
        assert inst.alive()
        drain(1.0)
        [a] = prompts([2000], seed=70)
        step("A", a, a)
        step("A again", a, a)
        for k, p in enumerate(prompts([3000] * 4, seed=71)):
            step(f"filler {k}", p, a)
        step("A after fillers", a, a)
        for k, p in enumerate(prompts([3000] * 8, seed=72)):  # 96 blocks > 64: A is evicted
            step(f"filler {4 + k}", p, a)
        step("A after more fillers", a, a)
        log_head = [line for line in inst.log_tail(200_000).splitlines()
                    if "mamba" in line.lower() or "prefix" in line.lower()][:20]
    sub.close(0)
    ctx.term()
    OUT.write_text(json.dumps({"model": "tiny qwen3_next (3 GDN : 1 attention)",
                               "block_size_tokens": bs, "num_blocks": BLOCKS,
                               "router_vs_vllm": [
                                   {"step": st["step"],
                                    "router_counted_before_tokens":
                                        st["router_counted_before_tokens"],
                                    "vllm_cached_tokens": st["vllm_cached_tokens"]}
                                   for st in steps],
                               "args": list(spec.args), "vllm_log_lines": log_head,
                               "steps": steps}, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
