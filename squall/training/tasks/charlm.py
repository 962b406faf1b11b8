"""A tiny character-level language model on the Python documentation's topics.

Corpus: ``pydoc_data.topics.topics``, the text behind ``help('TOPIC')`` (keywords, statements,
operators, special methods ...). The module belongs to CPython's standard library and is
installed with every Python, so nothing is downloaded: about 79 topics and 465 000 characters in
Python 3.11 (the exact text varies a little between Python releases, so compare runs made with
the same interpreter).

Text. Topics are joined in sorted order, separated by a newline. The vocabulary is fixed: an
"unknown" symbol, newline and the 95 printable ASCII characters (97 symbols); any other
character maps to "unknown", so the vocabulary does not depend on the Python release.

Model. The next character is predicted from the previous ``context`` characters: each is
embedded (``embed`` dims), the embeddings are concatenated, then one ReLU layer of ``hidden``
units and a softmax over the vocabulary. With the defaults (8, 16, 128) that is 30 577 parameters.

Split. The last ``test_fraction`` of every topic is held out; :meth:`evaluate` scores an evenly
spaced subset of ``eval_samples`` held-out positions and reports ``loss`` (nats per character),
``perplexity`` = exp(loss) and next-character ``accuracy``. The sharding group of a training
position is its topic, so ``label``/``dirichlet`` sharding gives ranks different topics.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from squall.training.tasks.base import Batch, ClassifierTask, ParamLayout
from squall.training.tasks.sharding import Sharding

UNKNOWN = 0
VOCAB = "\x00\n" + "".join(chr(c) for c in range(32, 127))  # index 0 stands for any other character
VOCAB_SIZE = len(VOCAB)


@functools.lru_cache(maxsize=1)
def corpus() -> tuple[np.ndarray, np.ndarray]:
    """``(codes, topic)``: the joined topics as vocabulary indices, and each character's topic index."""
    from pydoc_data.topics import topics

    table = np.full(0x110000, UNKNOWN, dtype=np.int64)
    for i, ch in enumerate(VOCAB[1:], start=1):
        table[ord(ch)] = i
    codes, owner = [], []
    for t, key in enumerate(sorted(topics)):
        text = topics[key] + "\n"
        codes.append(table[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)])
        owner.append(np.full(len(text), t, dtype=np.int64))
    return np.concatenate(codes), np.concatenate(owner)


class CharLM(ClassifierTask):
    """Next-character prediction from a fixed window (see the module docstring)."""

    name = "charlm"

    def __init__(
        self,
        *,
        context: int = 8,
        embed: int = 16,
        hidden: int = 128,
        max_chars: int | None = None,
        test_fraction: float = 0.1,
        eval_samples: int = 8192,
        sharding: Sharding | None = None,
    ) -> None:
        if context < 1 or embed < 1 or hidden < 1:
            raise ValueError("context, embed and hidden must be >= 1")
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        codes, owner = corpus()
        if max_chars is not None:
            codes, owner = codes[:max_chars], owner[:max_chars]
        self.context, self.embed, self.hidden = context, embed, hidden
        self.codes = torch.from_numpy(codes)
        self._offsets = torch.arange(-context, 0)
        train_pos, test_pos = self._split(owner, test_fraction)
        if len(train_pos) == 0 or len(test_pos) == 0:
            raise ValueError(f"max_chars={max_chars} leaves no training or no test positions")
        self.positions = torch.from_numpy(train_pos)
        pick = np.unique(np.linspace(0, len(test_pos) - 1, min(eval_samples, len(test_pos))).astype(np.int64))
        self.test_positions = torch.from_numpy(test_pos[pick])  # the held-out positions evaluate() scores
        layout = ParamLayout(
            (
                ("emb", (VOCAB_SIZE, embed)),
                ("w1", (hidden, context * embed)),
                ("b1", (hidden,)),
                ("w2", (VOCAB_SIZE, hidden)),
                ("b2", (VOCAB_SIZE,)),
            )
        )
        super().__init__(
            layout=layout,
            groups=owner[train_pos],
            sharding=sharding or Sharding(),
            test=self._window(torch.from_numpy(test_pos[pick])),
        )

    def _split(self, owner: np.ndarray, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
        """Positions with a full context, split into the head and the held-out tail of each topic."""
        positions = np.arange(self.context, len(owner))
        topic = owner[positions]
        starts = np.searchsorted(owner, np.arange(owner.max() + 1), side="left")
        ends = np.searchsorted(owner, np.arange(owner.max() + 1), side="right")
        cut = ends - np.ceil((ends - starts) * test_fraction).astype(np.int64)
        held_out = positions >= cut[topic]
        return positions[~held_out], positions[held_out]

    def _window(self, positions: torch.Tensor) -> Batch:
        return self.codes[positions[:, None] + self._offsets], self.codes[positions]

    def gather(self, indices: torch.Tensor) -> Batch:
        return self._window(self.positions[indices])

    def init_params(self, seed: int) -> torch.Tensor:
        fan_in = {
            "emb": 1,
            "w1": self.context * self.embed,
            "b1": self.context * self.embed,
            "w2": self.hidden,
            "b2": self.hidden,
        }
        return self.layout.init_uniform(seed, fan_in)

    def logits(self, params: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        v = self.layout.views(params)
        x = v["emb"][inputs].reshape(len(inputs), self.context * self.embed)
        h = torch.relu(x @ v["w1"].T + v["b1"])
        return h @ v["w2"].T + v["b2"]

    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        scores = super().evaluate(params)
        scores["perplexity"] = math.exp(min(scores["loss"], 700.0))
        return scores
