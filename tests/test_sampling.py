"""The callback's hyper-step samplers and batch plumbing, without a Trainer."""

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.lightning.sampling import (
    LoaderBatches,
    SampledBatches,
    ShardedSampler,
    StreamPosition,
    draws_by_index,
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


class Counting(IterableDataset):
    """A stream of the samples 0 … n−1 (each a tensor [i], label i), the same order every pass."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter((torch.tensor([float(i)]), i) for i in range(self.n))


def _ids(batch):
    return batch[0].flatten().int().tolist()


def test_streamed_loaders_are_read_through_the_loader_itself():
    stream = DataLoader(Counting(10), batch_size=4)
    pre_batched = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=None)  # rows as batches
    assert not draws_by_index(stream) and not draws_by_index(pre_batched)
    assert draws_by_index(DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4))
    moved = []
    batches = LoaderBatches(stream, lambda b: moved.append(b) or b, 2, None, "train dataloader")
    assert batches.sampler.batch_size == 4 and batches.sampler.global_batch == 8
    drawn = [_ids(next(batches)) for _ in range(5)]
    # passes of 4 + 4 + 2 (the loader's own tail), then a new pass from the start
    assert drawn == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(moved) == 5 and batches.samples == 18  # every batch went through to_device
    assert (batches.sampler.epoch, batches.sampler.pos) == (2, 2)
    rebatched = LoaderBatches(stream, lambda b: b, 1, 3, "train dataloader")  # batch_size=3
    assert _ids(next(rebatched)) == [0, 1, 2]
    rows = LoaderBatches(pre_batched, lambda b: b, 1, None, "train dataloader")
    assert next(rows)[0].shape == (2,)


def test_a_streamed_loaders_position_resumes_exactly():
    stream = DataLoader(Counting(10), batch_size=3)
    first = LoaderBatches(stream, lambda b: b, 1, None, "x")
    for _ in range(5):  # a pass of 4, then 1 into the next
        next(first)
    state = first.sampler.state_dict()
    assert state == {"stream_pos": 1, "stream_epoch": 2, "global_batch": 3}
    expected = [_ids(next(first)) for _ in range(4)]
    resumed = LoaderBatches(stream, lambda b: b, 1, None, "x")
    resumed.sampler.load_state_dict(state)
    assert [_ids(next(resumed)) for _ in range(4)] == expected == [[3, 4, 5], [6, 7, 8], [9],
                                                                   [0, 1, 2]]  # fmt: skip


@pytest.mark.parametrize(
    "state, match",
    [
        ({"stream_pos": 1}, "not a streamed loader's"),
        ({"stream_pos": 1, "stream_epoch": 1, "global_batch": 5}, "global batches of 5"),
        ({"stream_pos": -1, "stream_epoch": 1, "global_batch": 3}, "stream_pos must be"),
        (
            {"generator": 0, "perm": None, "pos": 0, "epoch": 0, "n": 10, "global_batch": 3},
            "same kind of DataLoader",
        ),  # fmt: skip
    ],
)
def test_a_streamed_loaders_bad_state_is_refused(state, match):
    position = StreamPosition(3, 1)
    with pytest.raises(ConfigurationError, match=match):
        position.load_state_dict(state)
    assert (position.pos, position.epoch, position.skip) == (0, 0, 0)


def test_a_loader_that_yields_batches_cannot_be_rebatched():
    pre_batched = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=None)
    with pytest.raises(ConfigurationError, match="yields whole batches.*batch_size=5"):
        LoaderBatches(pre_batched, lambda b: b, 1, 5, "train dataloader")
    with pytest.raises(ConfigurationError, match="validation dataloader yielded no batch"):
        LoaderBatches(DataLoader(Counting(0), batch_size=2), lambda b: b, 1, None,
                      "validation dataloader")  # fmt: skip


def test_a_hyper_step_batch_above_the_loaders_is_read_in_parts_of_its_size():
    """val_batch_size=60 over a validation loader of batch 20: the hyper steps' E and ∇E are
    averaged over three parts of 20 (the model never sees more than the loader's batch), and
    on a model without batch statistics λ follows the same path as with one batch of 60."""
    import lightning_problems as lp

    from hypertorch_sid import HyperOptimizationCallback

    seen: list[int] = []

    class Watched(lp.Ridge):
        def outer_loss(self, batch):
            seen.append(len(batch[0]))
            return super().outer_loss(batch)

    data = lp.ridge_data()  # 120 training, 60 validation points
    lams = {}
    for loader_batch in (20, 60):
        seen.clear()
        train, val = lp.loaders(data, batch_size=20, val_batch_size=loader_batch)
        cb = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=3, val_batch_size=60)
        model = Watched()
        lp.trainer([cb], max_steps=12, limit_val_batches=0).fit(model, train, val)
        lams[loader_batch] = model.log_lam.detach().clone()
        assert cb.sid.hyper_step == 6
        assert max(seen) == loader_batch and len(seen) == 6 * 60 // loader_batch, seen
    torch.testing.assert_close(lams[20], lams[60], rtol=1e-12, atol=1e-12)
    assert not torch.equal(lams[20], torch.full_like(lams[20], lams[20][0]))  # λ moved


def test_parts_padded_to_different_lengths_are_read_as_several_batches():
    """Each part of a chunked minibatch collated to its own length (padded sequences) is still
    several batches to the core, not one ambiguous list."""
    from hypertorch_sid.core.outer import SeveralBatches, _validation_batches

    parts = SeveralBatches(
        [(torch.zeros(2, 5), torch.zeros(2)), (torch.zeros(2, 7), torch.zeros(2))]
    )
    batches, several = _validation_batches(parts)
    assert several and len(batches) == 2
    plain = [(torch.zeros(2, 5), torch.zeros(2)), (torch.zeros(2, 7), torch.zeros(2))]
    assert _validation_batches(plain)[1] is False  # a plain list of unlike parts: one batch
