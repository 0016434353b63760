"""The global manager stays current with its pools and applies the hybrid rule per pool."""

import random

import pytest
from cache_factories import BS, chain, dense_geometry, linear_only_geometry, make_pool

from prfaas.cache import GlobalKVCacheManager, HybridPrefixPool
from prfaas.core.errors import ConfigError

Setup = tuple[GlobalKVCacheManager, dict[str, HybridPrefixPool]]


def setup(n_per_cluster: int = 2, capacity: int | None = None, policy: str = "every_block",
          k: int = 1, **manager_kw: bool) -> Setup:
    manager = GlobalKVCacheManager(BS, **manager_kw)
    pools = {}
    geometry = {(True, True): None, (True, False): dense_geometry(),
                (False, True): linear_only_geometry()}[(manager.needs_blocks,
                                                        manager.needs_snapshots)]
    for cluster in ("prfaas", "pd"):
        for i in range(n_per_cluster):
            name = f"{cluster}-{i}"
            manager.add_instance(name, cluster)
            pools[name] = make_pool(capacity, policy, k, geometry, manager, name)
    return manager, pools


def test_insert_is_visible_per_instance_and_per_cluster() -> None:
    manager, pools = setup()
    a = chain(6)
    pools["pd-1"].insert(a[:4], 4 * BS)
    pools["prfaas-0"].insert(a, 6 * BS)
    m = manager.match(a)
    assert m.per_instance == {"prfaas-0": 6, "prfaas-1": 0, "pd-0": 0, "pd-1": 4}
    assert m.per_cluster == {"prfaas": 6, "pd": 4}
    assert m.best_instance("pd") == "pd-1"
    assert m.cached_tokens("pd-1") == 4 * BS and m.cluster_tokens("prfaas") == 6 * BS
    assert m.best_instance("nowhere") is None


def test_evictions_keep_the_index_current() -> None:
    manager, pools = setup(capacity=3 * 8 + 3 * 100)
    a, b = chain(3), chain(3, base=50)
    pools["pd-0"].insert(a, 3 * BS)
    assert manager.match(a).per_instance["pd-0"] == 3
    pools["pd-0"].insert(b, 3 * BS)  # evicts all of a
    assert manager.match(a).per_instance["pd-0"] == 0
    assert manager.match(b).per_instance["pd-0"] == 3
    assert manager.num_indexed_blocks == 3 and manager.num_indexed_snapshots == 3


def test_snapshot_eviction_shortens_the_global_answer() -> None:
    manager, pools = setup(capacity=6 * 8 + 2 * 100, policy="every_k", k=3)
    a = chain(6)
    pools["pd-0"].insert(a, 6 * BS)
    assert manager.match(a).per_cluster["pd"] == 6
    pools["pd-0"].insert(chain(1, base=900), BS)  # evicts the snapshot after block 6
    assert manager.match(a).per_cluster["pd"] == 3
    assert manager.match(a[:2]).per_cluster["pd"] == 0  # blocks alone are no hit


def test_ties_go_to_the_least_loaded() -> None:
    manager, pools = setup(n_per_cluster=3)
    a = chain(4)
    for name in ("pd-0", "pd-1", "pd-2"):
        pools[name].insert(a, 4 * BS)
    m = manager.match(a)
    assert m.best_instance("pd") == "pd-0"
    assert m.best_instance("pd", {"pd-0": 5, "pd-1": 1, "pd-2": 3}) == "pd-1"
    miss = manager.match(chain(2, base=77))
    assert miss.best_instance("prfaas", {"prfaas-0": 2, "prfaas-2": 1}) == "prfaas-1"


def test_shared_pool_serves_many_instances() -> None:
    manager = GlobalKVCacheManager(BS)
    for i in range(3):
        manager.add_instance(f"pd-{i}", "pd", pool_id="pd-global")
    manager.add_instance("prfaas-0", "prfaas")
    shared = make_pool(pool_id="pd-global", listener=manager)
    a = chain(5)
    shared.insert(a, 5 * BS)
    m = manager.match(a)
    assert m.per_instance == {"pd-0": 5, "pd-1": 5, "pd-2": 5, "prfaas-0": 0}


def test_dense_and_linear_only_rules() -> None:
    manager, pools = setup(policy="request_end", needs_snapshots=False)
    a = chain(5)
    pools["pd-0"].insert(a, 5 * BS)
    assert manager.match(a[:3]).per_cluster["pd"] == 3
    manager, pools = setup(policy="every_k", k=2, needs_blocks=False)
    pools["pd-0"].insert(a, 5 * BS)
    assert manager.match(a[:3]).per_cluster["pd"] == 2
    assert manager.match(a).per_cluster["pd"] == 5


@pytest.mark.parametrize("policy", ["every_block", "every_k", "request_end"])
def test_manager_agrees_with_every_pool_under_random_churn(policy: str) -> None:
    # Small pools, shared prefixes, pins held across inserts: the fast search's prefix-closure
    # assumption must hold for real pools, so both searches must equal the pools' own answers.
    rng = random.Random(7)
    manager, pools = setup(n_per_cluster=3, capacity=40 * 8 + 10 * 100, policy=policy, k=3)
    prefixes = [chain(12, base=1000 * j) for j in range(6)]
    pinned: list[tuple[str, list[int], int]] = []
    checks = 0
    for _ in range(600):
        name = rng.choice(list(pools))
        pool = pools[name]
        req = rng.choice(prefixes)[: rng.randint(1, 12)]
        action = rng.random()
        if action < 0.6:
            pool.insert(req, len(req) * BS + rng.randint(0, BS - 1))
        elif action < 0.7:
            hit = pool.match(req)
            if hit and pool.acquire(req, hit):
                pinned.append((name, req, hit))
        elif action < 0.8 and pinned:
            owner, held, hit = pinned.pop(rng.randrange(len(pinned)))
            pools[owner].release(held, hit)
        else:
            want = {n: p.match(req) for n, p in pools.items()}
            assert manager.match(req).per_instance == want, req
            assert manager.match(req, exact=True).per_instance == want, req
            checks += 1
    assert checks > 50
    assert sum(p.stats.evictions for p in pools.values()) > 100  # the churn really evicted


def test_exact_search_handles_a_listener_with_holes() -> None:
    # A listener that breaks prefix closure (block 1 missing): only exact=True is reliable.
    manager = GlobalKVCacheManager(BS, needs_snapshots=False)
    manager.add_instance("x", "pd")
    manager.on_insert("x", [10, 12, 13], [])
    assert manager.match([10, 11, 12, 13], exact=True).per_instance["x"] == 1


def test_registration_errors() -> None:
    manager = GlobalKVCacheManager(BS)
    manager.add_instance("a", "pd")
    with pytest.raises(ConfigError, match="instance_id='a'"):
        manager.add_instance("a", "pd")
    with pytest.raises(ConfigError, match="pool_id='ghost'"):
        manager.on_insert("ghost", [1], [1])
    with pytest.raises(ConfigError, match="block_size_tokens=0"):
        GlobalKVCacheManager(0)


def test_attach_announces_existing_contents() -> None:
    pool = make_pool(policy="every_k", k=2)
    a = chain(5)
    pool.insert(a, 5 * BS)
    manager = GlobalKVCacheManager(BS)
    manager.add_instance("p0", "pd")
    assert manager.match(a).per_instance["p0"] == 0
    pool.attach(manager)
    assert manager.match(a).per_instance["p0"] == 5
    assert manager.match(a[:3]).per_instance["p0"] == 2
