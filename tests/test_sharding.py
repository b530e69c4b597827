"""`--shard K/N` (tests/sharding.py): every module in exactly one shard, whole, and the work spread evenly."""

from __future__ import annotations

from sharding import SHARD_WEIGHTS, shards_of


def test_every_module_is_in_exactly_one_shard_and_the_heaviest_are_spread():
    modules = {name: (3, 0) for name in SHARD_WEIGHTS} | {"test_new_a.py": (2, 0), "test_quick.py": (0, 40)}
    weight = {name: SHARD_WEIGHTS.get(name, 5 * long) + other for name, (long, other) in modules.items()}
    for count in (1, 2, 3, 5):
        found = shards_of(modules, count)
        assert sorted(found) == sorted(modules)
        assert set(found.values()) <= set(range(1, count + 1))
        load = [0] * count
        for name, shard in found.items():
            load[shard - 1] += weight[name]
        assert max(load) - min(load) <= max(weight.values()), (count, load)  # no shard beyond the lightest by more
    three = shards_of(modules, 3)
    assert len({three["test_environments.py"], three["test_containers.py"], three["test_hostile_submissions.py"]}) == 3
    assert shards_of(modules, 3) == three  # the same modules always go to the same shards


def test_quick_tests_weigh_a_second_each_long_ones_their_modules_share():
    found = shards_of({"test_environments.py": (0, 5), "test_quick.py": (0, 100)}, 2)
    assert found["test_quick.py"] != found["test_environments.py"]  # its long tests are not selected: 5 s
    found = shards_of({"test_small.py": (1, 0), "test_big.py": (100, 0), "test_mid.py": (0, 20)}, 2)
    assert found["test_big.py"] != found["test_small.py"] and found["test_small.py"] == found["test_mid.py"]
