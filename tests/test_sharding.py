"""`--shard K/N` (tests/sharding.py): every module in exactly one shard, whole, and the work spread evenly."""

from __future__ import annotations

from sharding import SHARD_WEIGHTS, shards_of


def test_every_module_is_in_exactly_one_shard_and_the_heaviest_are_spread():
    modules = {name: 3 for name in SHARD_WEIGHTS} | {"test_new_a.py": 2, "test_new_b.py": 40}
    for count in (1, 2, 3, 5):
        found = shards_of(modules, count)
        assert sorted(found) == sorted(modules)
        assert set(found.values()) <= set(range(1, count + 1))
        load = [0] * count
        for name, shard in found.items():
            load[shard - 1] += SHARD_WEIGHTS.get(name, 5 * modules[name])
        heaviest = max(SHARD_WEIGHTS.get(name, 5 * n) for name, n in modules.items())
        assert max(load) - min(load) <= heaviest, (count, load)  # greedy: no shard beyond the lightest by more
    three = shards_of(modules, 3)
    assert len({three["test_environments.py"], three["test_containers.py"], three["test_hostile_submissions.py"]}) == 3
    assert shards_of(modules, 3) == three  # the same modules always go to the same shards


def test_a_module_not_listed_weighs_by_its_tests():
    found = shards_of({"test_small.py": 1, "test_big.py": 100}, 2)
    assert found["test_big.py"] != found["test_small.py"]
