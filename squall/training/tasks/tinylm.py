"""A small decoder-only transformer language model on the Python documentation's topics.

The low-communication family (DiLoCo, Streaming DiLoCo, SPARTA, DeMo) is published on GPT-style
language models; this is the smallest one that is still recognisably that: token and learned
position embeddings, ``layers`` pre-norm blocks of causal multi-head self-attention and a 4x MLP
(GELU), a final layer norm, and an output layer tied to the token embedding.

Corpus and split: the ``charlm`` task's (:func:`~squall.training.tasks.charlm.corpus`): the topics
of ``pydoc_data.topics``, 97 character symbols, and the last ``test_fraction`` of every topic held
out. A training sample is a window of ``context + 1`` consecutive training characters (inputs are
the first ``context``, targets the last ``context``: every position predicts the next character),
starting anywhere; its sharding group is the topic it starts in. :meth:`TinyLM.evaluate` scores
non-overlapping windows that lie inside the held-out tails (at most ``eval_windows`` of them,
evenly spaced) and reports ``loss`` (nats per character), ``perplexity`` = exp(loss) and
next-character ``accuracy``.

Sizes (``context`` 64): ``d_model`` 128 with 4 layers has 813 952 parameters (3.3 MB of float32);
:data:`DEEP` (8 layers) has 1 607 040, for larger payloads; :data:`SMALL` (64 wide, 2 layers,
context 32) has 108 352, for tests and grids where only the bytes matter.

Initialisation (the same for the same seed on every rank): weights normal with s.d. 0.02, the two
projections that write into the residual stream scaled by ``1/sqrt(2 layers)`` (GPT-2's rule),
layer-norm gains 1 and every bias 0.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the usual torch alias

from squall.training.tasks.base import SEED_INIT, Batch, ParamLayout, SupervisedTask
from squall.training.tasks.charlm import VOCAB_SIZE, corpus
from squall.training.tasks.sharding import Sharding, derive_seed

#: Named configurations (keyword arguments) besides the defaults.
SMALL: Final = {"d_model": 64, "layers": 2, "heads": 2, "context": 32}
DEEP: Final = {"layers": 8}
INIT_STD: Final = 0.02


def block_names(i: int) -> tuple[str, ...]:
    """The tensors of block ``i``, in packing order (every name starts with ``h<i>.``)."""
    return tuple(f"h{i}.{n}" for n in ("ln1.w", "ln1.b", "qkv.w", "qkv.b", "proj.w", "proj.b",
                                        "ln2.w", "ln2.b", "fc.w", "fc.b", "out.w", "out.b"))


def layout_of(*, d_model: int, layers: int, context: int) -> ParamLayout:
    """Token and position embeddings, the blocks in order, the final layer norm."""
    d, hidden = d_model, 4 * d_model
    shapes: list[tuple[str, tuple[int, ...]]] = [("tok", (VOCAB_SIZE, d)), ("pos", (context, d))]
    for i in range(layers):
        a = block_names(i)
        shapes += [(a[0], (d,)), (a[1], (d,)), (a[2], (3 * d, d)), (a[3], (3 * d,)), (a[4], (d, d)), (a[5], (d,)),
                   (a[6], (d,)), (a[7], (d,)), (a[8], (hidden, d)), (a[9], (hidden,)), (a[10], (d, hidden)),
                   (a[11], (d,))]
    shapes += [("lnf.w", (d,)), ("lnf.b", (d,))]
    return ParamLayout(tuple(shapes))


def text_split(owner: np.ndarray, test_fraction: float) -> np.ndarray:
    """True for every held-out character: the last ``test_fraction`` of its topic (as ``charlm``)."""
    topics = np.arange(owner.max() + 1)
    starts = np.searchsorted(owner, topics, side="left")
    ends = np.searchsorted(owner, topics, side="right")
    cut = ends - np.ceil((ends - starts) * test_fraction).astype(np.int64)
    held_out: np.ndarray = np.arange(len(owner)) >= cut[owner]
    return held_out


def window_starts(held_out: np.ndarray, span: int, *, inside: bool) -> np.ndarray:
    """Starts ``s`` whose characters ``s .. s+span-1`` are all training (``inside`` False) or all held out."""
    wanted = held_out if inside else ~held_out
    ok = np.convolve(wanted.astype(np.int64), np.ones(span, dtype=np.int64), mode="valid") == span
    return np.flatnonzero(ok).astype(np.int64)


class TinyLM(SupervisedTask):
    """Causal transformer next-character model (see the module docstring)."""

    name = "tinylm"

    def __init__(
        self,
        *,
        d_model: int = 128,
        layers: int = 4,
        heads: int = 4,
        context: int = 64,
        max_chars: int | None = None,
        test_fraction: float = 0.1,
        eval_windows: int = 256,
        sharding: Sharding | None = None,
    ) -> None:
        if d_model < 1 or layers < 1 or heads < 1 or context < 2:
            raise ValueError("tinylm: d_model, layers and heads must be >= 1 and context >= 2")
        if d_model % heads:
            raise ValueError(f"tinylm: d_model {d_model} must be a multiple of heads {heads}")
        if not 0 < test_fraction < 1:
            raise ValueError(f"tinylm: test_fraction must be in (0, 1), got {test_fraction}")
        if eval_windows < 1:
            raise ValueError(f"tinylm: eval_windows must be >= 1, got {eval_windows}")
        codes, owner = corpus()
        if max_chars is not None:
            codes, owner = codes[:max_chars], owner[:max_chars]
        self.d_model, self.layers, self.heads, self.context = d_model, layers, heads, context
        self.codes = torch.from_numpy(codes)
        held_out = text_split(owner, test_fraction)
        starts = window_starts(held_out, context + 1, inside=False)
        tails = self._test_starts(held_out, owner)
        if len(starts) == 0 or len(tails) == 0:
            raise ValueError(f"tinylm: max_chars={max_chars} leaves no training or no held-out window of "
                             f"{context + 1} characters")
        pick = np.unique(np.linspace(0, len(tails) - 1, min(eval_windows, len(tails))).astype(np.int64))
        self.starts = torch.from_numpy(starts)
        self.test = self._windows(torch.from_numpy(tails[pick]))
        super().__init__(layout=layout_of(d_model=d_model, layers=layers, context=context),
                         groups=owner[starts], sharding=sharding or Sharding())

    def _test_starts(self, held_out: np.ndarray, owner: np.ndarray) -> np.ndarray:
        """Non-overlapping windows inside each held-out tail, one every ``context`` characters."""
        span = self.context + 1
        out = []
        for t in range(int(owner.max()) + 1):
            tail = np.flatnonzero(held_out & (owner == t))
            if len(tail) >= span:
                out.append(np.arange(tail[0], tail[-1] - span + 2, self.context, dtype=np.int64))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def _windows(self, starts: torch.Tensor) -> Batch:
        chars = self.codes[starts[:, None] + torch.arange(self.context + 1)]
        return chars[:, :-1], chars[:, 1:]

    def gather(self, indices: torch.Tensor) -> Batch:
        return self._windows(self.starts[indices])

    def init_params(self, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(derive_seed(seed, SEED_INIT))
        flat = torch.zeros(self.layout.size, dtype=torch.float32)
        residual = INIT_STD / math.sqrt(2 * self.layers)
        for name, view in self.layout.views(flat).items():
            if name.endswith((".ln1.w", ".ln2.w")) or name == "lnf.w":
                view.fill_(1.0)
            elif view.dim() == 2:
                std = residual if name.endswith((".proj.w", ".out.w")) else INIT_STD
                view.copy_(torch.randn(view.shape, generator=gen) * std)
        return flat

    def logits(self, params: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """Next-character scores, shape ``(batch, context, vocabulary)``."""
        v = self.layout.views(params)
        b, t = inputs.shape
        d, h = self.d_model, self.heads
        x = v["tok"][inputs] + v["pos"][:t]
        for i in range(self.layers):
            p = f"h{i}."
            a = F.layer_norm(x, (d,), v[p + "ln1.w"], v[p + "ln1.b"])
            q, k, w = torch.split(F.linear(a, v[p + "qkv.w"], v[p + "qkv.b"]), d, dim=2)
            q, k, w = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, w))
            att = F.scaled_dot_product_attention(q, k, w, is_causal=True)
            x = x + F.linear(att.transpose(1, 2).reshape(b, t, d), v[p + "proj.w"], v[p + "proj.b"])
            m = F.layer_norm(x, (d,), v[p + "ln2.w"], v[p + "ln2.b"])
            x = x + F.linear(F.gelu(F.linear(m, v[p + "fc.w"], v[p + "fc.b"])), v[p + "out.w"], v[p + "out.b"])
        x = F.layer_norm(x, (d,), v["lnf.w"], v["lnf.b"])
        return x @ v["tok"].T

    def loss(self, params: torch.Tensor, batch: Batch) -> torch.Tensor:
        inputs, targets = batch
        return F.cross_entropy(self.logits(params, inputs).reshape(-1, VOCAB_SIZE), targets.reshape(-1))

    @torch.no_grad()
    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        inputs, targets = self.test
        logits = self.logits(params.detach(), inputs).reshape(-1, VOCAB_SIZE)
        loss = float(F.cross_entropy(logits, targets.reshape(-1)))
        accuracy = float((logits.argmax(dim=1) == targets.reshape(-1)).double().mean())
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": accuracy}
