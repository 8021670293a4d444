"""What the drop-ins add to a training step without a hyper step, counted (not timed).

On a GPU a small network is launch-bound: a step costs about the operations it dispatches, and
each value read back to the host waits for the device (session 49: ``LearnedDataWeights`` at
2.0-2.8x the plain wall time on an H200; ``benchmarks/bench_step_ops.py``)."""

from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

import pytest
import torch

from hypertorch_sid.lightning.isolation import LossWatch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_step_ops.py"
spec = importlib.util.spec_from_file_location("bench_step_ops", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
count = bench.count


def _scan(sequence: list[tuple[int, float]]) -> tuple[float | None, float | None, int | None]:
    """The first finite loss, the last finite one before the first non-finite, its step."""
    finite = [v for _, v in sequence if math.isfinite(v)]
    bad = next((s for s, v in sequence if not math.isfinite(v)), None)
    last = None
    for s, v in sequence:
        if bad is not None and s >= bad:
            break
        last = v
    return (finite[0] if finite else None), last, bad


@pytest.mark.parametrize("chunk", [1, 3, 7, 256])
def test_the_loss_watch_folded_in_chunks_finds_what_a_scan_finds(monkeypatch, chunk):
    monkeypatch.setattr(LossWatch, "CHUNK", chunk)
    rng = random.Random(chunk)
    for _ in range(60):
        n = rng.randint(1, 400)
        first_bad = rng.choice([None, rng.randrange(n)])
        sequence = []
        for i in range(n):
            v = rng.uniform(0.1, 5.0)
            if first_bad is not None and i >= first_bad and (i == first_bad or rng.random() < 0.8):
                v = float("nan") if rng.random() < 0.5 else float("inf")
            sequence.append((i + 5, v))
        watch = LossWatch()
        for step, v in sequence:
            watch.observe(torch.tensor(v), step)
        watch._fold()
        first, last, bad = (float(x) for x in watch._first)
        want_first, want_last, want_bad = _scan(sequence)
        assert (bad < 0) if want_bad is None else bad == want_bad
        if want_first is not None:
            assert first == pytest.approx(want_first, rel=1e-6)
        if want_last is not None:
            assert last == pytest.approx(want_last, rel=1e-6)


def test_the_loss_watch_holds_at_most_one_chunk_of_losses(monkeypatch):
    monkeypatch.setattr(LossWatch, "CHUNK", 16)
    watch = LossWatch()
    for step in range(100):
        watch.observe({"loss": torch.tensor(1.0 + step)}, step)
        assert len(watch._held) < 16
    assert watch.cause() is None  # no bad step


def test_the_drop_ins_training_steps_dispatch_few_operations_and_read_the_device_little():
    """Before session 49 a step under LearnedWeightDecay dispatched 67 operations (plain: 46)
    and under LearnedDataWeights 214 with 7 reads of the device; after it 48 / 174 with 2
    (3 counting ``tolist()``), after session 50 48 / 136 with 1."""
    plain = count("plain", epochs=3, from_step=10)
    decay = count("weight_decay", epochs=3, from_step=10)
    weights = count("data_weights", epochs=8, from_step=55)  # the cross term from step 50
    assert plain["host_reads_per_step"] == 0
    assert decay["host_reads_per_step"] == 0
    assert decay["ops_per_step"] <= plain["ops_per_step"] + 4
    assert weights["host_reads_per_step"] <= 1
    assert weights["ops_per_step"] <= plain["ops_per_step"] + 96


# ---------------------------------------------------------------------- session 50
# Each shortcut of the per-step path is checked against the path it replaced, bit for bit: the
# learned weights and the network's weights after a fit are then as before the change.
def test_the_data_weights_step_reads_the_device_once_on_the_mlp_and_the_cnn():
    """Before session 50 (counting ``tolist()`` as a read too): 175 operations / 3 reads per
    step on the MLP and 217 / 3 on the noisy-label CNN (plain 46 / 76, 0 reads); now 136 / 1
    and 170 / 1 (``benchmarks/results/step_ops/``)."""
    for network, epochs in (("mlp", 8), ("cnn", 7)):
        plain = count("plain", epochs=2, from_step=5, network=network)
        weights = count("data_weights", epochs=epochs, from_step=55, network=network)
        assert plain["host_reads_per_step"] == 0
        assert weights["host_reads_per_step"] == 1, network
        assert weights["ops_per_step"] <= plain["ops_per_step"] + 96, (network, weights)


def _fit_state(monkeypatch_cross_term_reads: bool, monkeypatch) -> dict[str, torch.Tensor]:
    from hypertorch_sid import LearnedDataWeights

    if monkeypatch_cross_term_reads:  # the norms read by the forward difference itself
        monkeypatch.setattr(LearnedDataWeights, "_cross_term_reads", lambda self: None)
    module, callbacks, _ = bench.fit("data_weights", epochs=7, network="mlp")
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    state["logits"] = callbacks[0].problem.weights.logits.detach().clone()
    state["last_loss"] = callbacks[0].problem._last_loss.clone()
    monkeypatch.undo()
    return state


def test_norms_read_ahead_with_the_batch_checks_give_the_same_fit_bit_for_bit(monkeypatch):
    ahead = _fit_state(False, monkeypatch)
    alone = _fit_state(True, monkeypatch)
    assert ahead.keys() == alone.keys()
    for key in ahead:
        assert torch.equal(ahead[key].nan_to_num(7.0), alone[key].nan_to_num(7.0)), key


def test_w_plus_hv_in_one_foreach_add_is_the_per_tensor_add():
    from hypertorch_sid.core.directional import _moved

    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen) for s in ((32, 20), (32,), (2, 32), (2,))]
    tangents = [torch.randn(p.shape, generator=gen) * 1e3 for p in params]
    for h in (3.5e-4, 1.7e-7, 0.3):
        fused = _moved(params, tangents, h)
        for p, t, f in zip(params, tangents, fused):
            assert torch.equal(f, torch.add(p, t, alpha=h))
    mixed = _moved([params[0], params[1].double()], [tangents[0], tangents[1].double()], 0.1)
    assert mixed[1].dtype == torch.float64 and torch.equal(
        mixed[1], torch.add(params[1].double(), tangents[1].double(), alpha=0.1)
    )


def test_each_rows_last_loss_is_the_mean_of_its_values_as_by_sums_and_counts():
    from hypertorch_sid.lightning.row_record import _row_means_into

    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        index = torch.randint(0, 30, (64,), generator=gen)  # rows held twice or more
        values = torch.rand(64, generator=gen) * 5
        target = torch.full((30,), float("nan"))
        target[::3] = 1.25
        before = target.clone()
        _row_means_into(target, index, values)
        rows, inverse = index.unique(return_inverse=True)
        sums = values.new_zeros(rows.shape).index_add_(0, inverse, values)
        counts = values.new_zeros(rows.shape).index_add_(0, inverse, torch.ones_like(values))
        want = before.clone()
        want[rows] = sums / counts
        assert torch.equal(target.nan_to_num(-1.0), want.nan_to_num(-1.0))


def test_lazy_adam_without_a_first_moment_moves_the_rows_as_the_general_formula():
    """β₁ = 0 (the data weights' default): m = g and 1 − 0ᵗ = 1 exactly, so the shortcut moves
    every row as the general formula does, and keeps the same state."""
    from hypertorch_sid.core.lazy_adam import LazyAdam

    gen = torch.Generator().manual_seed(2)
    x = torch.zeros(50, requires_grad=True)
    ref = torch.zeros(50)
    m, v, t = torch.zeros(50), torch.zeros(50), torch.zeros(50, dtype=torch.float64)
    opt = LazyAdam([x], lr=0.1, betas=(0.0, 0.999))
    b1, b2, eps = 0.0, 0.999, 1e-8
    for _ in range(30):
        rows = torch.randperm(50, generator=gen)[:16]
        g = torch.randn(16, generator=gen)
        x.grad = torch.sparse_coo_tensor(rows[None], g, (50,))
        opt.step()
        rows, g = x.grad.coalesce().indices()[0], x.grad.coalesce().values()
        mm = m.index_select(0, rows).mul_(b1).add_(g, alpha=1 - b1)
        vv = v.index_select(0, rows).mul_(b2).addcmul_(g, g, value=1 - b2)
        tt = t.index_select(0, rows).add_(1)
        m.index_copy_(0, rows, mm), v.index_copy_(0, rows, vv), t.index_copy_(0, rows, tt)
        c1, c2 = (1 - b1**tt).float(), (1 - b2**tt).float()
        ref.index_add_(0, rows, (mm / c1) / ((vv / c2).sqrt() + eps), alpha=-0.1)
        assert torch.equal(x.detach(), ref)
    state = opt.state[x]
    assert torch.equal(state["exp_avg"], m) and torch.equal(state["exp_avg_sq"], v)


def test_the_watch_norm_read_at_once_is_the_norm_read_tensor_by_tensor():
    from hypertorch_sid.core.watch import _norm

    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(s, generator=gen) * 10**k for k, s in enumerate(((7, 3), (5,), (2, 2, 2)))]
    old = math.sqrt(sum(float(torch.linalg.vector_norm(x.double())) ** 2 for x in xs))
    assert _norm(xs) == old and _norm([]) == 0.0


def test_a_hyper_step_batch_of_an_indexed_tensor_dataset_is_the_collated_samples():
    from torch.utils.data import TensorDataset, default_collate

    from hypertorch_sid import IndexedDataset
    from hypertorch_sid.lightning.sampling import fetch

    data = IndexedDataset(TensorDataset(torch.randn(40, 3, 2), torch.arange(40) % 7))
    idx = torch.randperm(40)[:9]
    fast, slow = fetch(data, default_collate, idx), default_collate([data[int(i)] for i in idx])
    assert type(fast) is type(slow) and type(fast.data) is type(slow.data)
    assert torch.equal(fast.index, slow.index) and fast.index.dtype == slow.index.dtype
    assert all(torch.equal(a, b) for a, b in zip(fast.data, slow.data))


def test_the_one_read_still_refuses_an_index_out_of_range_and_a_changed_label():
    from hypertorch_sid.core.errors import ConfigurationError
    from hypertorch_sid.core.sample_weights import SampleWeights
    from hypertorch_sid.lightning.data_weights_problem import DataWeightsProblem

    problem = DataWeightsProblem()
    problem.weights = SampleWeights(10)
    x = torch.randn(4, 2)
    with pytest.raises(ConfigurationError, match=r"out of range: got \[3, 12\] for 10 rows"):
        problem._read_checks(torch.tensor([3, 12, 5, 4]), (x, torch.tensor([0, 1, 1, 0])))
    labels = problem._read_checks(torch.tensor([3, 9, 5, 4]), (x, torch.tensor([0, 1, 1, 0])))
    problem._seen(torch.tensor([3, 9, 5, 4]), torch.rand(4), labels)
    problem._read_checks(torch.tensor([9, 3, 0]), (x[:3], torch.tensor([1, 0, 2])))  # as seen
    with pytest.raises(ConfigurationError, match=r"example 5 had label 1 .* has label 0 now"):
        problem._read_checks(torch.tensor([9, 5, 0]), (x[:3], torch.tensor([1, 0, 2])))


def test_the_step_size_from_norms_read_ahead_is_the_one_read_in_the_call():
    """h read ahead (``ForwardDifference.prefetch``, with the batch's checks) is the number the
    call reads itself, and ‖w‖ is read anew at every step, also after an edit through ``.data``
    that leaves the version counter as it was."""
    from hypertorch_sid.core.directional import ForwardDifference

    gen = torch.Generator().manual_seed(4)
    params = [torch.randn(8, 5, generator=gen), torch.randn(5, generator=gen)]
    tangents = [torch.randn(8, 5, generator=gen), torch.randn(5, generator=gen)]
    for _ in range(3):
        ahead, alone = ForwardDifference(), ForwardDifference()
        norms, read = ahead.prefetch(params, tangents)
        read(norms.tolist())
        assert ahead.step(params, tangents) == alone.step(params, tangents)
        params[0].data.mul_(1.5)  # no version bump: read again at the next step
        norms, read = ahead.prefetch(params, tangents)
        assert norms.numel() == 1  # ‖v‖ is held for v as it is
        read(norms.tolist())
        assert ahead.step(params, tangents) == ForwardDifference().step(params, tangents)
