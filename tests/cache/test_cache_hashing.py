import subprocess
import sys

import pytest

from prfaas.cache import chain_hashes, trace_block_hashes
from prfaas.core.errors import ConfigError


def test_only_full_blocks_are_hashed() -> None:
    assert len(chain_hashes(list(range(11)), 4)) == 2
    assert chain_hashes(list(range(3)), 4) == []


def test_hash_covers_the_whole_prefix() -> None:
    a = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = chain_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)  # same second block, different first
    assert a[0] != b[0]
    assert a[1] != b[1]
    c = chain_hashes([1, 2, 3, 4, 5, 6, 7, 9], 4)  # shares the first block only
    assert c[0] == a[0] and c[1] != a[1]


def test_seed_changes_hashes_and_values_are_u64() -> None:
    tokens = list(range(16))
    a, b = chain_hashes(tokens, 8, seed=0), chain_hashes(tokens, 8, seed=1)
    assert a != b
    assert all(0 <= h < 1 << 64 for h in a + b)


def test_deterministic_across_processes() -> None:
    # A fresh interpreter has a different hash() salt; our hashes must not depend on it.
    code = "from prfaas.cache import chain_hashes; print(chain_hashes(list(range(64)), 16, 7))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == str(chain_hashes(list(range(64)), 16, 7))


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ConfigError, match="block_size_tokens=0"):
        chain_hashes([1, 2], 0)
    with pytest.raises(ConfigError, match="seed"):
        chain_hashes([1, 2], 1, seed=-1)
    with pytest.raises(ConfigError, match="token_ids"):
        chain_hashes([1 << 70, 2], 2)


def test_trace_hash_ids_used_as_is_without_partial_tail() -> None:
    assert trace_block_hashes([5, 6, 7], 1500, 512) == [5, 6]  # 1500 = 2 full blocks + tail
    assert trace_block_hashes([5, 6, 7], 1536, 512) == [5, 6, 7]
    with pytest.raises(ConfigError, match="hash_ids=1"):
        trace_block_hashes([5], 1536, 512)
