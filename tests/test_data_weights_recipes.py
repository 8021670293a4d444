"""``LearnedDataWeights`` on recipes its own tests did not write (session 41's careless-user
sweep, docs/data_weights.md "Unseen recipes"): each either learns (the corrupted examples'
weights fall below the clean ones', finite) or is refused naming the cause and the fix."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import trainer
from torch import Tensor
from torch.utils.data import (
    ConcatDataset,
    DataLoader,
    Dataset,
    Subset,
    TensorDataset,
    WeightedRandomSampler,
    random_split,
)

from hypertorch_sid import ConfigurationError, IndexedDataset, LearnedDataWeights

N, NOISY = 240, 72  # the toy of tests/test_data_weights_lightning.py: the first NOISY flipped


def blobs(noisy: int = NOISY) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Three Gaussian classes in 2-D; the first ``noisy`` training labels shifted by one."""
    gen = torch.Generator().manual_seed(0)
    centres = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])

    def draw(n: int) -> tuple[Tensor, Tensor]:
        y = torch.arange(n) % 3
        return centres[y] + 0.8 * torch.randn(n, 2, generator=gen), y

    X, y = draw(N)
    y[:noisy] = (y[:noisy] + 1) % 3
    Xv, yv = draw(60)
    return X, y, Xv, yv


X, Y, XV, YV = blobs()
PerSample = Callable[[Tensor, Tensor], Tensor]


def cross_entropy(z: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(z, y, reduction="none")


class Classifier(pl.LightningModule):
    """A small MLP whose per-sample loss, optimizer and layers a recipe chooses."""

    def __init__(
        self,
        loss: PerSample = cross_entropy,
        adam: bool = False,
        batch_norm: bool = False,
        scheduler: bool = False,
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        norm = [torch.nn.BatchNorm1d(16)] if batch_norm else []
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2, 16), *norm, torch.nn.Tanh(), torch.nn.Linear(16, 3)
        )
        self.loss, self.adam, self.scheduler = loss, adam, scheduler

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return self.loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        params = self.parameters()
        opt = torch.optim.Adam(params, lr=1e-2) if self.adam else torch.optim.SGD(params, lr=0.2)
        if not self.scheduler:
            return opt
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 5, 0.5)}


def loader(dataset: Dataset | None = None, batch_size: int = 24, **kwargs: Any) -> DataLoader:
    dataset = dataset if dataset is not None else IndexedDataset(TensorDataset(X, Y))
    if "sampler" not in kwargs:
        kwargs["shuffle"] = True
    gen = torch.Generator().manual_seed(0)
    return DataLoader(dataset, batch_size=batch_size, generator=gen, **kwargs)


def val_loader() -> DataLoader:
    return DataLoader(TensorDataset(XV, YV), batch_size=60)


def callback(**kwargs: Any) -> LearnedDataWeights:
    kwargs.setdefault("every_n_steps", 2)
    kwargs.setdefault("start_step", 0)  # short fits: no plain warm-up
    kwargs.setdefault("seed", 0)
    return LearnedDataWeights(**kwargs)


def fit(
    model: pl.LightningModule | None = None,
    train: DataLoader | None = None,
    cb: LearnedDataWeights | None = None,
    epochs: int = 15,
    val: DataLoader | None = None,
    **kwargs: Any,
) -> LearnedDataWeights:
    cb = cb or callback()
    trainer([cb], max_epochs=epochs, **kwargs).fit(
        model or Classifier(), train or loader(), val or val_loader()
    )
    return cb


def assert_separates(cb: LearnedDataWeights, noisy: int = NOISY, margin: float = 0.2) -> None:
    w = cb.data_weights()
    assert w.shape == (N,) and bool(torch.isfinite(w).all())
    corrupted, clean = float(w[:noisy].mean()), float(w[noisy:].mean())
    assert corrupted < clean - margin, (corrupted, clean)


# ---------------------------------------------------------------------------- works
class DictSamples(Dataset):
    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"x": self.x[i], "y": self.y[i]}


class DictClassifier(Classifier):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return cross_entropy(self.net(batch["x"]), batch["y"])


class Mixup(Classifier):
    """Mixup inside training_step: loss i mixes example i with a shuffled partner."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        perm = torch.randperm(len(y))
        z = self.net(0.7 * x + 0.3 * x[perm])
        return 0.7 * cross_entropy(z, y) + 0.3 * cross_entropy(z, y[perm])


RECIPES: dict[str, Callable[[], dict[str, Any]]] = {
    # the loss: label smoothing and class weights; a (B, T) loss is averaged over T
    "label smoothing, class weights, (B,T) loss": lambda: dict(
        model=Classifier(
            lambda z, y: F.cross_entropy(
                z, y, reduction="none", label_smoothing=0.1, weight=torch.tensor([1.0, 2.0, 0.5])
            )[:, None].expand(-1, 4)
        )
    ),
    # multi-label BCE: the per-sample loss is the mean over the labels
    "BCE with logits multi-label (B,C)": lambda: dict(
        model=Classifier(
            lambda z, y: F.binary_cross_entropy_with_logits(
                z, F.one_hot(y, 3).float(), reduction="none"
            )
        )
    ),
    # the training: BatchNorm, Adam, a scheduler, accumulation, clipping, bf16 autocast
    "BatchNorm Adam StepLR accumulate clip bf16": lambda: dict(
        model=Classifier(adam=True, batch_norm=True, scheduler=True),
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        precision="bf16-mixed",
        epochs=20,
    ),
    # the data: dict samples, ConcatDataset/Subset inside the index, sampling with
    # replacement, drop_last, two persistent workers
    "dict samples": lambda: dict(
        model=DictClassifier(),
        train=loader(IndexedDataset(DictSamples(X, Y))),
        val=DataLoader(DictSamples(XV, YV), batch_size=60),
    ),
    "IndexedDataset(ConcatDataset(Subset, ...)), drop_last": lambda: dict(
        train=loader(
            IndexedDataset(
                ConcatDataset(
                    [Subset(TensorDataset(X, Y), range(120)), TensorDataset(X[120:], Y[120:])]
                )
            ),
            batch_size=25,
            drop_last=True,
        )
    ),
    "WeightedRandomSampler with replacement": lambda: dict(
        train=loader(
            sampler=WeightedRandomSampler(
                torch.ones(N), N, generator=torch.Generator().manual_seed(0)
            )
        )
    ),
    "mixup in training_step": lambda: dict(model=Mixup()),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_recipes_that_learn_which_examples_to_trust(recipe):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the toy's adjoint solves and bf16 warn; not the point
        cb = fit(**RECIPES[recipe]())
    assert_separates(cb)


def test_two_persistent_workers():
    cb = fit(train=loader(num_workers=2, persistent_workers=True), epochs=6)
    assert_separates(cb, margin=0.1)


def test_90_percent_noise_flags_the_corrupted_majority():
    """The batch gauge flags 201 at precision 0.99. The default class gauge (session 51) holds
    each class's mean logit, and here most of every class's labels are wrong: it flags fewer,
    169 at precision 1.00 (corrupted mean ω 0.23, clean 1.00)."""
    X, Y, *_ = blobs(noisy=216)
    cb = fit(train=loader(IndexedDataset(TensorDataset(X, Y))), cb=callback(gauge="batch"))
    assert_separates(cb, noisy=216, margin=0.5)
    flagged = cb.flagged()
    assert len(flagged) > 190 and float((flagged < 216).float().mean()) > 0.95
    cb = fit(train=loader(IndexedDataset(TensorDataset(X, Y))))
    assert_separates(cb, noisy=216, margin=0.5)
    flagged = cb.flagged()
    assert len(flagged) > 150 and float((flagged < 216).float().mean()) > 0.95


def test_a_negative_loss_is_refused_under_the_expected_error_and_learns_with_mean_loss():
    """A Gaussian NLL with a small variance is negative where the fit is good: ExpectedError
    reads a loss as −log p, so it refuses and names objective='mean_loss', which runs."""

    def gaussian_nll(z: Tensor, y: Tensor) -> Tensor:
        mean = z[:, 0]
        return F.gaussian_nll_loss(
            mean, (y == 0).float(), torch.full_like(mean, 0.05), reduction="none"
        )

    with pytest.raises(ConfigurationError, match="negative one.*objective='mean_loss'"):
        fit(Classifier(gaussian_nll, adam=True), epochs=3)
    cb = fit(Classifier(gaussian_nll, adam=True), cb=callback(objective="mean_loss"), epochs=3)
    assert bool(torch.isfinite(cb.data_weights()).all())


# ---------------------------------------------------------------------------- refused
def test_batch_size_one_is_refused_where_the_normalised_weights_cancel():
    """Σ ωᵢℓᵢ/Σ ωᵢ over one sample is ℓ: no weight moved (all stayed ½) and none was flagged,
    silently, until this refusal. normalize=False (mean ωᵢℓᵢ) is the way out."""
    with pytest.raises(ConfigurationError, match="batch_size=1.*normalize=False"):
        fit(train=loader(batch_size=1), epochs=1)


@pytest.mark.parametrize(
    "dataset",
    [
        lambda: Subset(IndexedDataset(TensorDataset(X, Y)), range(200)),
        lambda: random_split(IndexedDataset(TensorDataset(X, Y)), [200, 40])[0],
        lambda: ConcatDataset(
            [IndexedDataset(TensorDataset(X[:120], Y[:120])), IndexedDataset(TensorDataset(X, Y))]
        ),
    ],
    ids=["Subset", "random_split", "ConcatDataset"],
)
def test_an_index_inside_a_subset_or_concat_is_refused_naming_the_outermost_wrap(dataset):
    with pytest.raises(ConfigurationError, match="Wrap the outermost dataset"):
        fit(train=loader(dataset()), epochs=1)


def test_an_indexed_dataset_wrapped_twice_through_a_subset_is_refused():
    twice = IndexedDataset(Subset(IndexedDataset(TensorDataset(X, Y)), range(N)))
    with pytest.raises(ConfigurationError, match="already carries an index.*outermost"):
        twice[0]


class Reshuffled(Dataset):
    """A dataset that reorders its examples itself each epoch: index i is another example."""

    def __init__(self) -> None:
        self.order, self.reads = torch.arange(N), 0

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        self.reads += 1
        if self.reads % N == 0:
            self.order = torch.randperm(N, generator=torch.Generator().manual_seed(self.reads))
        j = self.order[i]
        return X[j], Y[j]


def test_indices_whose_examples_change_between_epochs_are_refused():
    """Until this check the fit ran and the weights meant nothing (corrupted 0.57, clean 0.58,
    30 of 99 flagged corrupted): a weight did not stay with one example."""
    with pytest.raises(
        ConfigurationError, match="indices are not stable.*shuffle in the DataLoader"
    ):
        fit(train=loader(IndexedDataset(Reshuffled())), epochs=3)


def test_a_random_augmentation_keeps_the_indices_stable():
    class Jitter(Dataset):
        def __len__(self) -> int:
            return N

        def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
            return X[i] + 0.1 * torch.randn(2), Y[i]

    assert_separates(fit(train=loader(IndexedDataset(Jitter()))))


def test_per_class_needs_integer_labels_and_the_classes_it_was_sized_for():
    onehot = DataLoader(TensorDataset(X, F.one_hot(Y, 3).float()), batch_size=24)
    model = Classifier(lambda z, t: F.cross_entropy(z, t, reduction="none"))
    with pytest.raises(ConfigurationError, match="integer class labels.*argmax"):
        fit(model, onehot, callback(per="class", num_classes=3), epochs=1)
    labels = DataLoader(TensorDataset(X, Y), batch_size=24)
    with pytest.raises(ConfigurationError, match=r"outside 0..1: pass num_classes=3"):
        fit(train=labels, cb=callback(per="class", num_classes=2), epochs=1)


# ---------------------------------------------------------------------------- read back
def test_a_clean_data_set_flags_nothing_and_says_why():
    """Without corrupted labels the self-normalised weights still split (199 of 240 drift
    down: the examples the network already fits, median loss 0.002 against 0.011), and the
    two-component split flagged those 199 as untrustworthy. Now flagged() reads each row's
    training loss at its last visit: low weights on well-fitted rows are no corrupted group."""
    X, Y, *_ = blobs(noisy=0)
    cb = fit(train=loader(IndexedDataset(TensorDataset(X, Y))))
    with pytest.warns(UserWarning, match="fitted no worse than the rest.*Flagged nothing"):
        assert len(cb.flagged()) == 0
    with pytest.warns(UserWarning, match="fitted no worse"):
        assert len(cb.flagged("split")) > 100  # a rule asked for by name: its rows, warned


def test_the_noisy_toy_still_flags_without_a_warning():
    cb = fit()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flagged = cb.flagged()
    assert float((flagged < NOISY).float().mean()) > 0.8 and len(flagged) > 0.85 * NOISY


def test_a_second_fit_on_another_data_set_says_the_weights_start_again():
    cb = fit(epochs=1)
    smaller = loader(IndexedDataset(TensorDataset(X[:200], Y[:200])))
    with pytest.warns(UserWarning, match="200 examples, the weights this callback learned 240"):
        fit(train=smaller, cb=cb, epochs=1)
    assert cb.data_weights().shape == (200,)


def test_a_second_fit_on_relabelled_data_of_the_same_size_starts_again_and_says_so():
    """The weights are kept across fits on the same data set; another one of the same size
    would silently inherit them. Refused at its first relabelled row until session 51; a
    TensorDataset of other content now starts every weight afresh, said, as another size
    does."""
    cb = fit(epochs=1)
    other = loader(IndexedDataset(TensorDataset(X, (Y + 1) % 3)))
    with pytest.warns(UserWarning, match="other examples than the ones this callback learned"):
        fit(train=other, cb=cb, epochs=1)


def test_a_resume_on_relabelled_data_of_the_same_size_is_refused(tmp_path):
    """The labels of the first visits travel in the checkpoint: the sampler's state (same
    size, same batch) let such a resume continue the old examples' weights, silently."""
    cb = callback()
    t = trainer([cb], max_epochs=2)
    t.fit(Classifier(), loader(), val_loader())
    t.save_checkpoint(tmp_path / "a.ckpt")
    other = loader(IndexedDataset(TensorDataset(X, (Y + 1) % 3)))
    # refused at the build by the checkpoint's digest of its TensorDataset (session 51), before
    # the first relabelled row would be
    with pytest.raises(ConfigurationError, match="resumes weights learned on other examples"):
        trainer([callback()], max_epochs=3).fit(
            Classifier(), other, val_loader(), ckpt_path=tmp_path / "a.ckpt"
        )
    trainer([same := callback()], max_epochs=3).fit(
        Classifier(), loader(), val_loader(), ckpt_path=tmp_path / "a.ckpt"
    )
    assert same.data_weights().shape == (N,)
