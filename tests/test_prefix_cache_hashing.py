"""Prefix-cache block hashes cannot be poisoned: SHA-256 chains over each block's tokens,
its parent, the adapter and the request's cache salt (vLLM's ``hash_block_tokens``).

The old scheme, ``hash((parent, tokens))``, is re-created here as a ``BlockHasher`` of
Python's ``hash``; in CPython ``hash(-1) == hash(-2)``, so two blocks that end in -1 and
-2 collide, and so does everything chained after them. The API never lets a negative
token id in, but the collision is exactly the CVE-2025-25183 class: a lookup checks only
the last block's tokens, so once a parent collides the next block is served from
another prompt's KV.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from octavo.config import EngineArgs
from octavo.kv_cache.block_hash import BlockHasher, BlockKeys, HashChain
from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.kv_events.events import wire_hash
from octavo.lora_request import LoRARequest
from octavo.sampling_params import MAX_CACHE_SALT_LENGTH, SamplingParams
from octavo.scheduler.sequence import block_keys

from serve_args import clean_environment, parse  # noqa: F401 (an autouse fixture)

BLOCK = 4
VICTIM = [1, 2, 3, -2, 5, 6, 7, 8, 9]  # two full blocks and one token to compute
ATTACKER = [1, 2, 3, -1, 5, 6, 7, 8, 9]  # block 0 collides under Python's hash
SQL = LoRARequest("sql", 1, "/adapters/sql")
CHAT = LoRARequest("chat", 2, "/adapters/chat")


def python_hash_hasher() -> BlockHasher:
    """The old scheme: Python's ``hash`` of (parent, tokens), no seed."""
    return BlockHasher("python-hash", lambda key: hash(key).to_bytes(8, "big", signed=True), b"")


def manager(hasher: BlockHasher | None = None, window: int | None = None) -> KVCacheManager:
    return KVCacheManager(BlockPool(16), BLOCK, window, hasher)


def cache(kv: KVCacheManager, seq_id: int, tokens: list[int], keys: BlockKeys) -> HashChain:
    """Compute ``tokens`` as sequence ``seq_id`` and register its full blocks."""
    chain = HashChain(keys)
    assert kv.allocate_slots(seq_id, 0, len(tokens))
    kv.cache_full_blocks(seq_id, tokens, len(tokens), chain)
    return chain


def num_hits(kv: KVCacheManager, tokens: list[int], keys: BlockKeys | None = None) -> int:
    return len(kv.find_cached_prefix(tokens, HashChain(keys or BlockKeys())))


def test_a_forced_collision_of_the_old_scheme_no_longer_serves_anothers_block():
    assert hash((None, tuple(VICTIM[:BLOCK]))) == hash((None, tuple(ATTACKER[:BLOCK])))
    # A window of one block: block 0 is behind it, so only block 1 must be cached.
    old = manager(python_hash_hasher(), window=BLOCK)
    cache(old, 1, VICTIM, BlockKeys())
    assert num_hits(old, ATTACKER) == 2  # the old scheme serves the victim's block 1
    new = manager(window=BLOCK)
    victim = cache(new, 1, VICTIM, BlockKeys())
    assert num_hits(new, VICTIM) == 2  # control: the same prompt does hit
    assert num_hits(new, ATTACKER) == 0
    attacker = new.hasher.extend(HashChain(), ATTACKER, BLOCK, 2)
    assert not set(attacker) & set(victim.hashes)


def test_the_same_salt_hits_and_another_salt_or_none_does_not():
    kv = manager()
    cache(kv, 1, VICTIM, BlockKeys(cache_salt="tenant-a"))
    assert num_hits(kv, VICTIM, BlockKeys(cache_salt="tenant-a")) == 2
    assert num_hits(kv, VICTIM, BlockKeys(cache_salt="tenant-b")) == 0
    assert num_hits(kv, VICTIM) == 0
    cache(kv, 2, VICTIM, BlockKeys())
    assert num_hits(kv, VICTIM) == 2  # unsalted requests share among themselves
    assert num_hits(kv, VICTIM, BlockKeys(cache_salt="tenant-b")) == 0


def test_the_salt_is_a_key_of_the_first_block_only_and_carried_by_the_chain():
    keys = BlockKeys(cache_salt="tenant-a")
    assert keys.extra_keys(0) == (("cache_salt", "tenant-a"),)
    assert keys.extra_keys(1) is None  # as vLLM: the chain carries it on
    hasher = BlockHasher.create()
    salted = hasher.extend(HashChain(keys), VICTIM, BLOCK, 2)
    plain = hasher.extend(HashChain(), VICTIM, BLOCK, 2)
    assert salted[0] != plain[0] and salted[1] != plain[1]


def test_lora_adapters_keep_separate_hashes():
    keys = [block_keys(None, None), block_keys(SQL, None), block_keys(CHAT, None)]
    keys.append(block_keys(LoRARequest("sql", 1, "/adapters/sql-v2"), None))  # reloaded
    keys.append(block_keys(SQL, "tenant-a"))
    hasher = BlockHasher.create()
    firsts = [hasher.extend(HashChain(k), VICTIM, BLOCK, 1)[0] for k in keys]
    assert len(set(firsts)) == len(keys)
    assert keys[1].extra_keys(1) == (("lora", "sql", "/adapters/sql"),)  # every block
    kv = manager()
    cache(kv, 1, VICTIM, keys[1])
    assert num_hits(kv, VICTIM, keys[1]) == 2
    assert [num_hits(kv, VICTIM, k) for k in (keys[0], keys[2], keys[3], keys[4])] == [0] * 4


def counting(hasher: BlockHasher) -> tuple[BlockHasher, list[Any]]:
    calls: list[Any] = []

    def hash_fn(key: Any) -> bytes:
        calls.append(key)
        return hasher.hash_fn(key)

    return BlockHasher(hasher.algo, hash_fn, hasher.seed), calls


def test_each_full_block_is_hashed_once_when_it_fills():
    hasher, calls = counting(BlockHasher.create())
    kv = KVCacheManager(BlockPool(16), BLOCK, None, hasher)
    tokens, chain = list(range(100, 109)), HashChain()
    assert kv.find_cached_prefix(tokens, chain) == [] and len(calls) == 2
    assert kv.find_cached_prefix(tokens, chain) == [] and len(calls) == 2  # kept, not redone
    assert kv.allocate_slots(1, 0, len(tokens))
    kv.cache_full_blocks(1, tokens, len(tokens) - 1, chain)
    assert len(calls) == 2
    for step in range(20):  # decode: one token a step
        tokens.append(200 + step)
        assert kv.allocate_slots(1, len(tokens) - 1, 1)
        kv.cache_full_blocks(1, tokens, len(tokens), chain)
    assert len(calls) == len(tokens) // BLOCK
    assert kv.tables[1].hashes == chain.hashes


def test_tokens_cut_after_a_stop_string_drop_the_hashes_of_the_cut_blocks():
    hasher, chain = BlockHasher.create(), HashChain()
    tokens = list(range(12))
    first, *_ = hasher.extend(chain, tokens, BLOCK, 3)
    del tokens[6:]  # the stop checker's cut: only block 0 is still whole
    assert hasher.extend(chain, tokens, BLOCK, 3) == [first] and chain.hashes == [first]


def with_seed(monkeypatch, seed: str | None, algo: str) -> BlockHasher:
    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
    return BlockHasher.create(algo)


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_hashes_are_reproducible_with_pythonhashseed_and_random_without(monkeypatch, algo):
    first, second = with_seed(monkeypatch, "7", algo), with_seed(monkeypatch, "7", algo)
    key = (1, 2, 3, 4)
    assert first.hash_block(None, key) == second.hash_block(None, key)
    assert len(first.hash_block(None, key)) == hashlib.sha256().digest_size
    other = with_seed(monkeypatch, "8", algo)
    assert other.hash_block(None, key) != first.hash_block(None, key)
    unseeded = [with_seed(monkeypatch, None, algo) for _ in range(2)]
    assert unseeded[0].hash_block(None, key) != unseeded[1].hash_block(None, key)


def test_sha256_cbor_hashes_canonical_cbor_of_the_block_key(monkeypatch):
    import cbor2

    hasher = with_seed(monkeypatch, "0", "sha256_cbor")
    expected_seed = hashlib.sha256(cbor2.dumps("0", canonical=True)).digest()
    assert hasher.seed == expected_seed
    key = (expected_seed, (1, 2, 3, 4), None)
    expected = hashlib.sha256(cbor2.dumps(key, canonical=True)).digest()
    assert hasher.hash_block(None, (1, 2, 3, 4)) == expected
    assert with_seed(monkeypatch, "0", "sha256").hash_block(None, (1, 2, 3, 4)) != expected


def test_kv_events_carry_the_low_64_bits_of_the_block_hash_with_the_top_bit_set():
    pool = BlockPool(8, record_events=True)
    kv = KVCacheManager(pool, BLOCK)
    chain = cache(kv, 1, VICTIM, BlockKeys(cache_salt="tenant-a"))
    (stored,) = pool.take_events()
    low = [int.from_bytes(h[-8:], "big") for h in chain.hashes]
    assert stored.block_hashes == [value | 2**63 for value in low]
    assert stored.block_hashes == [wire_hash(h) for h in chain.hashes]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [((), "sha256"), (("--prefix-caching-hash-algo", "sha256_cbor"), "sha256_cbor")],
)
def test_the_flag_picks_the_algorithm_with_sha256_by_default(argv, expected):
    assert parse(*argv).prefix_caching_hash_algo == expected
    assert EngineArgs(prefix_caching_hash_algo=expected).prefix_caching_hash_algo == expected


def test_an_unknown_algorithm_is_refused_saying_which_exist(capsys):
    with pytest.raises(SystemExit):
        parse("--prefix-caching-hash-algo", "md5")
    assert "sha256_cbor" in capsys.readouterr().err
    with pytest.raises(ValueError, match="sha256, sha256_cbor"):
        EngineArgs(prefix_caching_hash_algo="md5")
    with pytest.raises(ValueError, match="sha256, sha256_cbor"):
        BlockHasher.create("md5")


BAD_SALTS: list[tuple[Any, Callable[[str], bool]]] = [
    ("", lambda message: "non-empty" in message),
    ("x" * (MAX_CACHE_SALT_LENGTH + 1), lambda message: "at most 1024" in message),
    (7, lambda message: "string" in message),
]


@pytest.mark.parametrize(("salt", "says"), BAD_SALTS)
def test_sampling_params_refuse_a_bad_cache_salt(salt, says):
    with pytest.raises(ValueError, match="cache_salt") as error:
        SamplingParams(cache_salt=salt)
    assert says(str(error.value))
    assert SamplingParams(cache_salt="x" * MAX_CACHE_SALT_LENGTH).cache_salt is not None


def test_a_render_names_the_salt_where_vllms_does_not_in_the_sampling_params():
    from octavo.entrypoints.openai.protocol import CompletionRequest
    from octavo.entrypoints.openai.render import generate_request

    body = CompletionRequest(prompt="hi", cache_salt="tenant-a")
    params = SamplingParams(cache_salt="tenant-a")
    rendered = generate_request(body, "cmpl-1", [1, 2], params)
    assert rendered.cache_salt == "tenant-a"
    assert "cache_salt" not in rendered.sampling_params
