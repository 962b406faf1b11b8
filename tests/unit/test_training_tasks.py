"""Tasks: gradients, the known optimum, data splits, sharding, ballast."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from squall.training.tasks import (
    TASKS,
    Ballast,
    CharLM,
    DigitsLogReg,
    DigitsMLP,
    LeastSquares,
    Sharding,
    SupervisedTask,
    Task,
    all_shards,
    ballast_count,
    make_task,
)
from squall.training.tasks.charlm import VOCAB_SIZE, corpus

FD_EPS = 1e-6
FD_TOLERANCE = 1e-6  # max |autograd - central difference| in float64
FD_COORDS = 12  # coordinates checked per task


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    return {name: make_task(name) for name in TASKS}


def _float64_grad_check(task: SupervisedTask, seed: int) -> float:
    """Largest gap between the autograd gradient and central differences, at random coordinates."""
    params = task.init_params(seed).double() + 0.05 * torch.randn(
        task.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    )
    batch = next(task.batches(0, 2, seed, 16))
    _, grad = task.loss_and_grad(params, batch)
    assert grad.shape == params.shape and grad.dtype == torch.float64
    coords = torch.randperm(task.dim, generator=torch.Generator().manual_seed(seed))[:FD_COORDS]
    worst = 0.0
    for i in coords.tolist():
        e = torch.zeros_like(params)
        e[i] = FD_EPS
        fd = (float(task.loss(params + e, batch)) - float(task.loss(params - e, batch))) / (2 * FD_EPS)
        worst = max(worst, abs(fd - float(grad[i])))
    return worst


@pytest.mark.parametrize("name", sorted(TASKS))
def test_gradient_matches_finite_differences(tasks: dict[str, Task], name: str) -> None:
    task = tasks[name]
    assert isinstance(task, SupervisedTask)
    worst = _float64_grad_check(task, seed=3)
    assert worst < FD_TOLERANCE, f"{name}: autograd vs finite differences differ by {worst:.3g} > {FD_TOLERANCE}"


def test_logreg_gradient_matches_the_closed_form(tasks: dict[str, Task]) -> None:
    task = tasks["logreg_digits"]
    assert isinstance(task, DigitsLogReg)
    params = task.init_params(1)
    x, y = next(task.batches(0, 1, 0, 64))
    _, grad = task.loss_and_grad(params, (x, y))
    probs = torch.softmax(task.logits(params, x), dim=1)
    residual = (probs - torch.nn.functional.one_hot(y, 10).float()) / len(y)
    expected = torch.cat([(residual.T @ x).reshape(-1), residual.sum(0)])
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name,dim", [("logreg_digits", 650), ("mlp_digits", 9610), ("quadratic", 20), ("charlm", 30577)]
)
def test_dimensions_init_and_determinism(tasks: dict[str, Task], name: str, dim: int) -> None:
    task = tasks[name]
    assert task.dim == dim
    a, b = task.init_params(7), task.init_params(7)
    assert a.dtype == torch.float32 and a.shape == (dim,) and torch.equal(a, b)
    if name != "quadratic":  # the quadratic starts at zero by design
        assert not torch.equal(a, task.init_params(8))
    scores = task.evaluate(a)
    assert "loss" in scores and np.isfinite(scores["loss"])


def test_quadratic_closed_form_optimum_is_the_minimiser() -> None:
    task = LeastSquares(dim=12, groups=4, rows_per_group=32, heterogeneity=2.0, l2=0.05)
    # Stationarity of the full objective at x*, in float64.
    x = task.optimum.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(task.loss(x, (task.a64, task.b64)), x)
    assert float(grad.norm()) < 1e-10
    # The same minimiser from an independent solver: ridge regression as an augmented least squares.
    n = task.a64.shape[0]
    aug_a = torch.cat([task.a64 / n**0.5, (task.l2**0.5) * torch.eye(12, dtype=torch.float64)])
    aug_b = torch.cat([task.b64 / n**0.5, torch.zeros(12, dtype=torch.float64)])
    lstsq = torch.linalg.lstsq(aug_a, aug_b.unsqueeze(1)).solution.squeeze(1)
    torch.testing.assert_close(task.optimum, lstsq, rtol=1e-9, atol=1e-9)
    # Any perturbation is worse, and the reported scores agree.
    scores = task.evaluate(task.optimum.float())
    assert scores["suboptimality"] < 1e-6 and scores["distance"] < 1e-5
    worse = task.evaluate((task.optimum + 0.01).float())
    assert worse["suboptimality"] > 0 and worse["loss"] > scores["loss"]


def test_quadratic_is_heterogeneous_across_ranks() -> None:
    task = LeastSquares(heterogeneity=1.0)
    local = [task.local_optimum(r, 4, seed=0) for r in range(4)]
    gaps = [float((opt - task.optimum).norm()) for opt in local]
    assert min(gaps) > 1.0, f"local optima too close to the global one: {gaps}"
    # Without heterogeneity, noise or regularisation every shard has the same minimiser.
    same = LeastSquares(heterogeneity=0.0, noise=0.0, l2=1e-9)
    assert max(float((same.local_optimum(r, 4, 0) - same.optimum).norm()) for r in range(4)) < 1e-4


def test_digits_split_is_fixed_stratified_and_disjoint(tasks: dict[str, Task]) -> None:
    task = tasks["logreg_digits"]
    assert isinstance(task, DigitsLogReg)
    test_x, test_y = task.test
    assert len(task.train_y) + len(test_y) == 1797
    assert 0.24 < len(test_y) / 1797 < 0.26
    assert set(torch.bincount(test_y).tolist()) <= set(range(43, 48))  # ~25 % of each class (~180)
    train_rows = {tuple(r) for r in task.train_x.numpy().round(4).tolist()}
    overlap = sum(tuple(r) in train_rows for r in test_x.numpy().round(4).tolist())
    assert overlap < 10  # digits has a handful of duplicate images; nothing systematic
    assert torch.equal(DigitsMLP().test[1], test_y)  # same split for every digits task


@pytest.mark.parametrize("sharding", ["iid", "label", "dirichlet:0.3", "dirichlet:100"])
@pytest.mark.parametrize("world", [1, 3, 4, 7])
def test_shards_are_seeded_disjoint_and_cover(sharding: str, world: int) -> None:
    labels = np.repeat(np.arange(10), 50)
    spec = Sharding.parse(sharding)
    shards = all_shards(labels, world=world, seed=11, sharding=spec)
    again = all_shards(labels, world=world, seed=11, sharding=spec)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))
    merged = np.concatenate(shards)
    assert len(merged) == len(labels) and set(merged.tolist()) == set(range(len(labels)))
    assert all(len(s) >= 1 for s in shards)
    other = all_shards(labels, world=world, seed=12, sharding=spec)
    if world > 1:
        assert any(not np.array_equal(a, b) for a, b in zip(shards, other, strict=True))


def _skew(labels: np.ndarray, shards: list[np.ndarray]) -> float:
    """Mean total-variation distance between each shard's label histogram and the global one."""
    classes = np.unique(labels)
    glob = np.array([np.mean(labels == c) for c in classes])
    return float(
        np.mean([0.5 * np.abs(np.array([np.mean(labels[s] == c) for c in classes]) - glob).sum() for s in shards])
    )


def test_non_iid_shards_are_skewed(tasks: dict[str, Task]) -> None:
    task = tasks["logreg_digits"]
    assert isinstance(task, DigitsLogReg)
    y = task.groups
    iid = _skew(y, all_shards(y, world=4, seed=0, sharding=Sharding("iid")))
    label = _skew(y, all_shards(y, world=4, seed=0, sharding=Sharding("label")))
    dir01 = _skew(y, all_shards(y, world=4, seed=0, sharding=Sharding("dirichlet", alpha=0.1)))
    dir100 = _skew(y, all_shards(y, world=4, seed=0, sharding=Sharding("dirichlet", alpha=100.0)))
    assert iid < 0.08 and dir100 < 0.1
    assert label > 0.5 and dir01 > 0.4, (iid, label, dir01, dir100)
    label_shards = all_shards(y, world=4, seed=0, sharding=Sharding("label"))
    # 8 label-sorted pieces of ~168 samples (~135 per class): each spans at most 3 classes.
    assert max(len(np.unique(y[s])) for s in label_shards) <= 6
    sizes = [len(s) for s in label_shards]
    assert max(sizes) - min(sizes) <= 2


def test_sharding_parse_and_validation() -> None:
    assert Sharding.parse(None) == Sharding()
    assert Sharding.parse("dirichlet:0.25") == Sharding("dirichlet", alpha=0.25)
    assert Sharding.parse({"kind": "label", "shards_per_rank": 3}) == Sharding("label", shards_per_rank=3)
    for bad in ("bogus", {"kind": "iid", "alpah": 1}, "dirichlet:-1"):
        with pytest.raises(ValueError):
            Sharding.parse(bad)
    with pytest.raises(ValueError, match="cannot split"):
        all_shards(np.zeros(3), world=4, seed=0, sharding=Sharding())


def test_batches_come_from_the_shard_and_reshuffle_each_epoch(tasks: dict[str, Task]) -> None:
    task = tasks["quadratic"]
    assert isinstance(task, LeastSquares)
    shard = task.shard(1, 4, seed=5)
    rows = {tuple(r) for r in task.a[torch.from_numpy(shard)].numpy().tolist()}
    stream = task.batches(1, 4, seed=5, batch_size=32)
    epochs = [list(itertools.islice(stream, len(shard) // 32)) for _ in range(2)]
    for batch in epochs[0] + epochs[1]:
        assert batch[0].shape == (32, 20)
        assert all(tuple(r) in rows for r in batch[0].numpy().tolist())
    first = torch.cat([b[1] for b in epochs[0]])
    assert sorted(first.tolist()) == sorted(task.b[torch.from_numpy(shard)].tolist())  # one epoch = the shard
    assert not torch.equal(first, torch.cat([b[1] for b in epochs[1]]))
    again = next(task.batches(1, 4, seed=5, batch_size=32))
    assert torch.equal(again[1], epochs[0][0][1])
    assert not torch.equal(next(task.batches(2, 4, seed=5, batch_size=32))[1], again[1])


def test_charlm_corpus_vocabulary_and_windows(tasks: dict[str, Task]) -> None:
    codes, topic = corpus()
    assert len(codes) > 100_000 and codes.max() < VOCAB_SIZE and (codes == 0).mean() < 0.01
    assert np.all(np.diff(topic) >= 0)
    task = tasks["charlm"]
    assert isinstance(task, CharLM)
    x, y = next(task.batches(0, 4, seed=0, batch_size=8))
    assert x.shape == (8, task.context) and y.shape == (8,)
    pos = task.positions[:3]
    wx, wy = task.gather(torch.arange(3))
    assert torch.equal(wy, task.codes[pos]) and torch.equal(wx[:, -1], task.codes[pos - 1])
    assert len(task.test[1]) == 8192 and not set(task.positions.tolist()) & set(task.test_positions.tolist())
    scores = task.evaluate(task.init_params(0))
    assert abs(scores["perplexity"] - np.exp(scores["loss"])) < 1e-6 * scores["perplexity"]
    assert scores["loss"] == pytest.approx(np.log(VOCAB_SIZE), rel=0.1)  # near uniform at init


def test_ballast_pads_with_inert_parameters(tasks: dict[str, Task]) -> None:
    inner = tasks["logreg_digits"]
    task = make_task("logreg_digits", ballast_mb=0.5)
    assert isinstance(task, Ballast)
    assert ballast_count(0.5) == 131072 and task.dim == inner.dim + 131072 and task.model_dim == inner.dim
    params = task.init_params(0)
    assert torch.equal(params[: inner.dim], inner.init_params(0)) and not params[inner.dim :].any()
    batch = next(task.batches(0, 1, 0, 16))
    loss, grad = task.loss_and_grad(params, batch)
    inner_loss, inner_grad = inner.loss_and_grad(params[: inner.dim], batch)
    assert loss == inner_loss and torch.equal(grad[: inner.dim], inner_grad) and not grad[inner.dim :].any()
    assert task.evaluate(params) == inner.evaluate(params[: inner.dim])
    assert make_task("logreg_digits", ballast_mb=0).dim == inner.dim


def test_make_task_rejects_unknown_names_and_arguments() -> None:
    with pytest.raises(ValueError, match="unknown task"):
        make_task("imagenet")
    with pytest.raises(ValueError, match="bad arguments"):
        make_task("quadratic", depth=3)
    assert make_task("mlp_digits", hidden=16).dim == 16 * 64 + 16 + 10 * 16 + 10
    assert isinstance(make_task("quadratic", sharding="iid"), LeastSquares)


def test_the_digits_are_read_from_scikit_learns_file_without_importing_it() -> None:
    """Importing scikit-learn (scipy and all) cost every job seconds of start-up before its first step."""
    import subprocess
    import sys

    code = ("import sys; from squall.training.tasks.digits import digits_split; (x, y), (tx, ty) = digits_split(); "
            "print(len(x) + len(tx), int(y.max()) + 1, 'sklearn' in sys.modules, 'scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1797", "10", "False", "False"]
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    from squall.training.tasks.digits import digits_split
    (x, y), (tx, ty) = digits_split()
    ref_x, ref_y = load_digits(return_X_y=True)
    assert sorted(torch.cat([y, ty]).tolist()) == sorted(ref_y.tolist())  # the same images, split as before
    assert float(torch.cat([x, tx]).sum()) == pytest.approx(float(ref_x.sum()) / 16.0, rel=1e-6)
