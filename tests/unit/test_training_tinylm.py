"""The tinylm task: sizes, the charlm split, identical shards and initial weights from fixed seeds, causal
attention, held-out loss and perplexity; and AdamW against torch's."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from squall.training.optim import AdamW, AdamWConfig
from squall.training.tasks import TinyLM, make_task
from squall.training.tasks.charlm import corpus
from squall.training.tasks.tinylm import DEEP, SMALL, text_split

TINY: dict[str, Any] = {"d_model": 16, "layers": 2, "heads": 2, "context": 8, "max_chars": 20_000, "eval_windows": 8}


@pytest.fixture(autouse=True)
def one_thread() -> object:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("kwargs", "size"), [({}, 813_952), (DEEP, 1_607_040), (SMALL, 108_352)])
def test_parameter_counts(kwargs: dict[str, Any], size: int) -> None:
    assert TinyLM(**kwargs, max_chars=20_000).dim == size


def test_the_split_is_charlms_and_no_training_window_touches_held_out_text() -> None:
    task = TinyLM(d_model=16, layers=1, heads=1, context=8)
    _, owner = corpus()
    held_out = text_split(owner, 0.1)
    assert abs(held_out.mean() - 0.1) < 0.005
    starts = task.starts.numpy()
    for offset in range(task.context + 1):
        assert not held_out[starts + offset].any()
    assert len(task.test[0]) == 256 and task.test[1].shape == (256, 8)


def test_seeds_fix_the_initial_weights_and_the_shards() -> None:
    task = TinyLM(**TINY)
    assert torch.equal(task.init_params(3), TinyLM(**TINY).init_params(3))
    assert not torch.equal(task.init_params(3), task.init_params(4))
    shards = [set(task.shard(r, 4, 0).tolist()) for r in range(4)]
    assert sum(map(len, shards)) == task.train_size and not set.intersection(*shards)
    assert torch.equal(next(task.batches(1, 4, 0, 4))[0], next(TinyLM(**TINY).batches(1, 4, 0, 4))[0])


def test_attention_is_causal() -> None:
    task = TinyLM(**TINY)
    x = task.init_params(0)
    inputs = next(task.batches(0, 1, 0, 2))[0]
    changed = inputs.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 97
    a, b = task.logits(x, inputs), task.logits(x, changed)
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6) and not torch.allclose(a[:, -1], b[:, -1])


def test_evaluation_reports_loss_perplexity_and_accuracy_and_training_lowers_the_loss() -> None:
    task = make_task("tinylm", **TINY)
    x = task.init_params(0)
    before = task.evaluate(x)
    assert set(before) == {"loss", "perplexity", "accuracy"}
    assert before["perplexity"] == pytest.approx(math.exp(before["loss"]))
    assert abs(before["loss"] - math.log(97)) < 0.3  # about uniform at initialisation
    adam, batches = AdamW(), task.batches(0, 1, 0, 16)
    for _ in range(30):
        _, grad = task.loss_and_grad(x, next(batches))
        x = adam.update(x, grad, 1e-2)
    assert task.evaluate(x)["loss"] < before["loss"] - 0.5


def test_tensor_names_mark_the_blocks() -> None:
    names = TinyLM(**TINY).tensor_names
    assert names[:2] == ("tok", "pos") and names[-2:] == ("lnf.w", "lnf.b")
    assert sum(n.startswith("h1.") for n in names) == 12


def test_adamw_is_torchs_adamw() -> None:
    torch.manual_seed(0)
    p = torch.randn(500)
    ref = torch.nn.Parameter(p.clone())
    opt = torch.optim.AdamW([ref], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    mine = AdamW(AdamWConfig(beta2=0.95, weight_decay=0.1))
    for _ in range(25):
        g = torch.randn(500)
        ref.grad = g.clone()
        opt.step()
        p = mine.update(p, g, 1e-2)
    assert float((p - ref.detach()).abs().max()) < 1e-6
    with pytest.raises(ValueError, match="beta1"):
        AdamWConfig(beta1=1.0)
