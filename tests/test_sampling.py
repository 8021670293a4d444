"""The callback's hyper-step samplers and batch plumbing, without a Trainer."""

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.lightning.sampling import (
    SampledBatches,
    ShardedSampler,
    fetch,
    loader_parts,
    shard_indices,
)


def _draw(sampler, steps):
    return [sampler.next_indices() for _ in range(steps)]


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_of_one_global_batch_union_to_the_single_process_batch(world_size):
    n, batch_size, seed, steps = 50, 4, 7, 12  # several permutations (tails dropped)
    single = _draw(ShardedSampler(n, batch_size * world_size, seed, 0, 1), steps)
    ranks = [
        _draw(ShardedSampler(n, batch_size, seed, r, world_size), steps) for r in range(world_size)
    ]
    for step in range(steps):
        shards = [ranks[r][step] for r in range(world_size)]
        assert all(len(s) == batch_size for s in shards)
        assert torch.equal(torch.cat(shards), single[step])
        assert len(set(torch.cat(shards).tolist())) == batch_size * world_size  # disjoint


def test_each_permutation_is_used_without_repeats_then_redrawn():
    sampler = ShardedSampler(10, 3, seed=0, rank=0, world_size=1)
    epoch = torch.cat(_draw(sampler, 3))
    assert len(set(epoch.tolist())) == 9 and sampler.epoch == 1
    sampler.next_indices()
    assert sampler.epoch == 2 and sampler.pos == 3


def test_a_global_batch_larger_than_the_data_is_refused():
    with pytest.raises(ConfigurationError, match="larger than the data set"):
        ShardedSampler(10, 4, seed=0, rank=0, world_size=3)


def test_state_dict_round_trip_reproduces_the_sequence():
    a = ShardedSampler(23, 5, seed=3, rank=1, world_size=2)
    _draw(a, 5)
    state = a.state_dict()
    expected = _draw(a, 9)
    b = ShardedSampler(23, 5, seed=99, rank=1, world_size=2)  # other seed: state overrides it
    b.load_state_dict(state)
    assert all(torch.equal(x, y) for x, y in zip(_draw(b, 9), expected))
    fresh = ShardedSampler(23, 5, seed=3, rank=1, world_size=2)
    fresh.load_state_dict(ShardedSampler(23, 5, seed=3, rank=1, world_size=2).state_dict())
    assert torch.equal(fresh.next_indices(), ShardedSampler(23, 5, 3, 1, 2).next_indices())


def _corrupt(state, key, value):
    return {**state, key: value}


def _sound_state():
    sampler = ShardedSampler(12, 3, seed=0, rank=0, world_size=2)
    sampler.next_indices()
    return sampler.state_dict()


@pytest.mark.parametrize(
    ("state", "match"),
    [
        (None, "incomplete"),
        ({"pos": 0}, "incomplete"),
        (_corrupt(_sound_state(), "n", 13), "Resume with the same data"),
        (_corrupt(_sound_state(), "global_batch", 3), "Resume with the same data"),
        (_corrupt(_sound_state(), "generator", torch.zeros(3, dtype=torch.uint8)), "corrupted"),
        (_corrupt(_sound_state(), "generator", [1, 2]), "corrupted"),
        (_corrupt(_sound_state(), "perm", torch.zeros(12, dtype=torch.long)), "not a permutation"),
        (_corrupt(_sound_state(), "perm", torch.arange(11)), "not a permutation"),
        (_corrupt(_sound_state(), "pos", 13), "pos must be an integer"),
        (_corrupt(_sound_state(), "pos", -1), "pos must be an integer"),
        (_corrupt(_sound_state(), "pos", True), "pos must be an integer"),
        (_corrupt(_sound_state(), "epoch", 1.5), "epoch must be an integer"),
    ],
)
def test_check_state_rejects_a_corrupted_state_and_load_changes_nothing(state, match):
    sampler = ShardedSampler(12, 3, seed=0, rank=0, world_size=2)
    before = sampler.state_dict()
    with pytest.raises(ConfigurationError, match=match):
        sampler.check_state(state, "test sampler")
    with pytest.raises(ConfigurationError, match=match):
        sampler.load_state_dict(state)
    after = sampler.state_dict()
    assert torch.equal(after["generator"], before["generator"])
    assert (after["perm"], after["pos"], after["epoch"]) == (None, 0, 0)


def test_check_state_accepts_a_sound_state():
    ShardedSampler(12, 3, seed=5, rank=1, world_size=2).check_state(_sound_state(), "test")


class _Items(Dataset):
    """The same samples as a TensorDataset, served item by item."""

    def __init__(self, *tensors):
        self.tensors = tensors

    def __len__(self):
        return len(self.tensors[0])

    def __getitem__(self, i):
        return tuple(t[i] for t in self.tensors)


def test_fetch_vectorised_for_a_tensor_dataset_equals_item_by_item():
    X, y = torch.randn(20, 3), torch.randint(0, 4, (20,))
    idx = torch.tensor([4, 0, 19, 7, 7])
    fast = fetch(TensorDataset(X, y), default_collate, idx)
    slow = fetch(_Items(X, y), default_collate, idx)
    assert len(fast) == len(slow) == 2
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))
    assert torch.equal(fast[0], X[idx])
    custom = fetch(TensorDataset(X, y), lambda items: len(items), idx)  # a custom collate is used
    assert custom == len(idx)


def test_sampled_batches_draw_from_the_sampler_and_count_samples():
    X = torch.arange(12.0).unsqueeze(1)
    sampler = ShardedSampler(12, 4, seed=1, rank=0, world_size=1)
    expected = ShardedSampler(12, 4, seed=1, rank=0, world_size=1)
    batches = SampledBatches(TensorDataset(X), default_collate, sampler, lambda b: b[0] * 2)
    for _ in range(4):
        assert torch.equal(next(batches), X[expected.next_indices()] * 2)
    assert batches.samples == 16 and iter(batches) is batches


@pytest.mark.parametrize(("n", "world_size"), [(10, 1), (10, 2), (10, 3), (7, 4), (2, 3)])
def test_shard_indices_pad_by_wrapping_like_distributed_sampler(n, world_size):
    shards = [shard_indices(n, r, world_size) for r in range(world_size)]
    per_rank = -(-n // world_size)
    assert all(len(s) == per_rank for s in shards)
    assert set(torch.cat(shards).tolist()) == set(range(n))
    padded = torch.arange(per_rank * world_size) % n
    assert all(torch.equal(s, padded[r::world_size]) for r, s in enumerate(shards))
    sampler = torch.utils.data.DistributedSampler(
        range(n), num_replicas=world_size, rank=1 % world_size, shuffle=False
    )
    assert list(sampler) == shards[1 % world_size].tolist()


def test_loader_parts():
    data = TensorDataset(torch.randn(8, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=3)
    assert loader_parts(loader, "x") == (data, default_collate, 3)
    assert loader_parts([loader, loader], "x")[2] == 3
    with pytest.raises(ConfigurationError, match="must be a torch DataLoader"):
        loader_parts(iter(loader), "x")
    with pytest.raises(ConfigurationError, match="automatic batching disabled"):
        loader_parts(torch.utils.data.DataLoader(data, batch_size=None), "x")
