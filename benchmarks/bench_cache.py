"""Benchmark: global prefix match + routing decision for 128K-token requests.

Setup (seeded): 16 instances (4 PrfaaS + 12 PD), one HybridPrefixPool each, Kimi-Linear-48B-A3B
geometry, 512-token blocks, a snapshot every 8 blocks. Documents are 256-block chains (one of
64 shared 16-block system prompts + 240 own blocks); each lives on one instance, 30% also on a
second instance up to a random cut. Documents are added until the manager indexes >= 1M
distinct blocks. Requests: 256 blocks (128K tokens); 80% reuse a random prefix of a document
and then diverge, 20% are new. A decision = manager.match + per-cluster best instance (ties ->
least loaded) + uncached-length-vs-threshold. Timed with perf_counter on one pinned core,
tracemalloc off; memory measured separately with tracemalloc (pools filled, then the manager
built by `attach`, in-process and with fresh key objects as over a wire). Baselines in the same
run: asking the 16 pools one by one, and the manager's exact (per-block) search.

Run: .venv/bin/python benchmarks/bench_cache.py  -> benchmarks/results/cache.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from array import array
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from prfaas.cache import GlobalKVCacheManager, HybridPrefixPool, PoolConfig, chain_hashes
from prfaas.models.catalog import find_model
from prfaas.models.kv import geometry

SEED = 20260429
MODEL = "Kimi-Linear-48B-A3B"
BLOCK_TOKENS = 512
REQ_BLOCKS = 256
TARGET_INDEXED = 1_000_000
CLUSTERS = {"prfaas": 4, "pd": 12}
THRESHOLD_TOKENS = 19_400  # the paper's t; any value works for timing
NUM_REQUESTS = 2000
REPEATS = 7
CONFIG = PoolConfig(None, BLOCK_TOKENS, "every_k", 8)
OUT = Path(__file__).parent / "results" / "cache.json"


def instance_ids() -> list[tuple[str, str]]:
    return [(f"{c}-{i}", c) for c, n in CLUSTERS.items() for i in range(n)]


def make_documents(rng: np.random.Generator, num_docs: int) -> list[list[int]]:
    prompts = rng.integers(0, 1 << 63, size=(64, 16), dtype=np.int64).tolist()
    own = rng.integers(0, 1 << 63, size=(num_docs, REQ_BLOCKS - 16), dtype=np.int64).tolist()
    picks = rng.integers(0, 64, size=num_docs).tolist()
    return [prompts[p] + o for p, o in zip(picks, own, strict=True)]


def fill_pools(rng: np.random.Generator, docs: list[list[int]]) -> dict[str, HybridPrefixPool]:
    g = geometry(find_model(MODEL))
    pools = {name: HybridPrefixPool(name, g, CONFIG) for name, _ in instance_ids()}
    names = list(pools)
    for doc in docs:
        home, other = rng.choice(names, size=2, replace=False).tolist()
        pools[home].insert(doc, REQ_BLOCKS * BLOCK_TOKENS)
        if rng.random() < 0.3:
            cut = int(rng.integers(1, REQ_BLOCKS + 1))
            pools[other].insert(doc[:cut], cut * BLOCK_TOKENS)
    return pools


class _WireCopy:
    """Hands the manager fresh int objects, as a router fed over the network would get
    (attach() in-process shares the pool's key objects, which tracemalloc does not count)."""

    def __init__(self, manager: GlobalKVCacheManager) -> None:
        self.manager = manager

    def on_insert(self, pool_id: str, block_hashes: Sequence[int],
                  snapshot_hashes: Sequence[int]) -> None:
        self.manager.on_insert(pool_id, array("Q", block_hashes).tolist(),
                               array("Q", snapshot_hashes).tolist())

    def on_evict(self, pool_id: str, block_hashes: Sequence[int],
                 snapshot_hashes: Sequence[int]) -> None:
        self.manager.on_evict(pool_id, block_hashes, snapshot_hashes)


def standalone_manager_bytes(pools: dict[str, HybridPrefixPool]) -> int:
    manager = GlobalKVCacheManager(BLOCK_TOKENS)
    for name, cluster in instance_ids():
        manager.add_instance(name, cluster)
    before = tracemalloc.get_traced_memory()[0]
    for pool in pools.values():
        listener = pool.listener
        pool.attach(_WireCopy(manager))
        pool.listener = listener
    return tracemalloc.get_traced_memory()[0] - before


def make_requests(rng: np.random.Generator, docs: list[list[int]]) -> list[list[int]]:
    out = []
    for _ in range(NUM_REQUESTS):
        fresh = rng.integers(0, 1 << 63, size=REQ_BLOCKS, dtype=np.int64).tolist()
        if rng.random() < 0.8:
            cut = int(rng.integers(1, REQ_BLOCKS + 1))
            doc = docs[int(rng.integers(0, len(docs)))]
            out.append(doc[:cut] + fresh[cut:])
        else:
            out.append(fresh)
    return out


def decide(manager: GlobalKVCacheManager, hashes: list[int],
           load: dict[str, float]) -> tuple[str, str | None]:
    """The routing decision on top of the match (the real routers come later)."""
    m = manager.match(hashes)
    total_tokens = len(hashes) * BLOCK_TOKENS
    cluster = "pd" if total_tokens - m.cluster_tokens("pd") <= THRESHOLD_TOKENS else "prfaas"
    return cluster, m.best_instance(cluster, load)


def decide_by_pools(pools: dict[str, HybridPrefixPool], hashes: list[int]) -> dict[str, int]:
    return {name: pool.match(hashes) for name, pool in pools.items()}


def time_rate(fn: object, requests: list[list[int]]) -> dict[str, float]:
    assert callable(fn)
    rates = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for req in requests:
            fn(req)
        rates.append(len(requests) / (time.perf_counter() - start))
    return {"median_per_s": statistics.median(rates), "min_per_s": min(rates),
            "max_per_s": max(rates), "us_per_decision": 1e6 / statistics.median(rates)}


def main() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    rng = np.random.default_rng(SEED)
    num_docs = TARGET_INDEXED // (REQ_BLOCKS - 16) + 1  # own blocks dominate the distinct count
    docs = make_documents(rng, num_docs)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    pools = fill_pools(rng, docs)
    fill_s = time.perf_counter() - t0
    pool_bytes = tracemalloc.get_traced_memory()[0] - before
    manager = GlobalKVCacheManager(BLOCK_TOKENS)
    for name, cluster in instance_ids():
        manager.add_instance(name, cluster)
    before = tracemalloc.get_traced_memory()[0]
    for pool in pools.values():
        pool.attach(manager)
    manager_bytes = tracemalloc.get_traced_memory()[0] - before
    standalone_bytes = standalone_manager_bytes(pools)
    tracemalloc.stop()

    requests = make_requests(rng, docs)
    load = {name: float(rng.integers(0, 8)) for name, _ in instance_ids()}
    # Cross-check before timing: the manager and the pools agree on every request.
    for req in requests[:200]:
        m = manager.match(req)
        assert m.per_instance == decide_by_pools(pools, req)
    decisions = [decide(manager, req, load) for req in requests]
    hits = [manager.match(r).per_cluster for r in requests]

    gc.collect()
    gc.disable()  # the timed loops allocate little; keep collector pauses out of the ratio
    manager_rate = time_rate(lambda r: decide(manager, r, load), requests)
    exact_rate = time_rate(lambda r: manager.match(r, exact=True), requests[:1000])
    pools_rate = time_rate(lambda r: decide_by_pools(pools, r), requests[:400])
    gc.enable()
    tokens = list(range(REQ_BLOCKS * BLOCK_TOKENS))
    t0 = time.perf_counter()
    for _ in range(5):
        chain_hashes(tokens, BLOCK_TOKENS)
    hash_ms = (time.perf_counter() - t0) / 5 * 1e3

    pool_entries = sum(len(p._resident) for p in pools.values())
    indexed = manager.num_indexed_blocks
    result = {
        "what": "global prefix match + routing decision, 128K-token requests (256 x 512)",
        "how": __doc__.strip().splitlines()[2:12] if __doc__ else [],
        "config": {"model": MODEL, "block_size_tokens": BLOCK_TOKENS, "request_blocks":
                   REQ_BLOCKS, "instances": CLUSTERS, "snapshot_policy": CONFIG.snapshot_policy,
                   "snapshot_every_k": CONFIG.snapshot_every_k, "requests": NUM_REQUESTS,
                   "repeats": REPEATS, "seed": SEED, "threshold_tokens": THRESHOLD_TOKENS},
        "index": {"indexed_blocks": indexed, "indexed_snapshots": manager.num_indexed_snapshots,
                  "pool_entries_total": pool_entries, "fill_s": round(fill_s, 2)},
        "decisions": manager_rate,
        "baseline_ask_16_pools": pools_rate,
        "baseline_exact_search_match_only": exact_rate,
        "speedup_vs_pools": manager_rate["median_per_s"] / pools_rate["median_per_s"],
        "speedup_vs_exact_search": manager_rate["median_per_s"] / exact_rate["median_per_s"],
        "target_decisions_per_s": 20_000,
        "meets_target": manager_rate["median_per_s"] >= 20_000,
        "memory": {"manager_bytes_sharing_pool_keys": manager_bytes,
                   "manager_bytes_per_indexed_block_sharing_pool_keys": manager_bytes / indexed,
                   "manager_bytes_standalone": standalone_bytes,
                   "manager_bytes_per_indexed_block_standalone": standalone_bytes / indexed,
                   "note": "per indexed block = all manager bytes (blocks + snapshots index) "
                           "/ distinct indexed blocks",
                   "pools_bytes": pool_bytes, "pool_bytes_per_entry": pool_bytes / pool_entries,
                   "method": "tracemalloc traced-memory delta (Python heap only)"},
        "workload_check": {
            "pd_share": sum(c == "pd" for c, _ in decisions) / len(decisions),
            "mean_best_hit_blocks": statistics.mean(max(h.values()) for h in hits),
        },
        "chain_hashes_128k_tokens_ms": hash_ms,
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "cpu_count": os.cpu_count(), "pinned_to_one_core":
                    hasattr(os, "sched_setaffinity")},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("index", "decisions", "speedup_vs_pools",
                                             "memory")}, indent=2))


if __name__ == "__main__":
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
