"""A synthetic word stream whose best achievable perplexity is known, so a language model needs no download.

The words come from a first-order Markov source: each of `vocab` words is
followed by one of `successors` words (always including the next word id, so
every word is reachable), with probabilities drawn from a Dirichlet
distribution. A model that learns the source exactly reaches the source's own
perplexity on held-out words (`MarkovSource.perplexity`); a unigram model stays
far above it. Deterministic by seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MarkovSource", "windows"]


@dataclass(frozen=True)
class MarkovSource:
    """vocab: words (ids 0..vocab-1); successors: words that may follow each word (2..vocab);
    concentration: the Dirichlet parameter of each word's next-word distribution (lower: more peaked)."""

    vocab: int
    successors: int = 8
    concentration: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab < 2 or not 2 <= self.successors <= self.vocab or self.concentration <= 0:
            raise ValueError(f"MarkovSource needs vocab >= 2, 2 <= successors <= vocab and concentration > 0, "
                             f"got vocab={self.vocab}, successors={self.successors}, "
                             f"concentration={self.concentration}")

    def transitions(self) -> tuple[np.ndarray, np.ndarray]:
        """(next words [vocab, successors] int64, their probabilities [vocab, successors] float64)."""
        rng = np.random.default_rng(self.seed)
        words = np.arange(self.vocab)
        following = np.empty((self.vocab, self.successors), dtype=np.int64)
        following[:, 0] = (words + 1) % self.vocab
        for word in words:
            others = rng.choice(self.vocab - 1, size=self.successors - 1, replace=False)
            following[word, 1:] = (word + 2 + others) % self.vocab  # never word + 1 again
        return following, rng.dirichlet(np.full(self.successors, self.concentration), size=self.vocab)

    def sample(self, length: int, seed: int) -> np.ndarray:
        """`length` words [length] int32 from the source, starting at a word drawn by `seed`."""
        if length < 1:
            raise ValueError(f"length must be positive, got {length}")
        following, probabilities = self.transitions()
        rng = np.random.default_rng([self.seed, seed])
        cumulative = np.cumsum(probabilities, axis=1)
        uniforms = rng.random(length)
        words = np.empty(length, dtype=np.int32)
        words[0] = rng.integers(self.vocab)
        for position in range(1, length):
            previous = words[position - 1]
            choice = min(int(np.searchsorted(cumulative[previous], uniforms[position])), self.successors - 1)
            words[position] = following[previous, choice]
        return words

    def perplexity(self, previous: np.ndarray, following: np.ndarray) -> float:
        """The source's own perplexity of the words `following` (any shape), each after the word at the same
        place in `previous`: the lowest a model can expect there. Raises ValueError for a pair the source
        never emits."""
        successors, probabilities = self.transitions()
        previous, following = np.asarray(previous).reshape(-1), np.asarray(following).reshape(-1)
        matches = successors[previous] == following[:, None]
        if not matches.any(axis=1).all():
            raise ValueError("the words contain a transition the source never makes")
        return float(np.exp(-np.mean(np.log(np.sum(probabilities[previous] * matches, axis=1)))))


def windows(words: np.ndarray, batch: int, time_steps: int) -> np.ndarray:
    """The stream cut as TF-LM batches it: `batch` rows of consecutive words, then windows of `time_steps` + 1
    words (inputs and the targets one word later) along the rows. Returns [windows, batch, time_steps + 1]
    int32. Raises ValueError when `words` hold no full window."""
    if batch < 1 or time_steps < 1 or (len(words) // batch - 1) // time_steps < 1:
        raise ValueError(f"{len(words)} words hold no window of batch {batch} x {time_steps + 1} steps")
    row_length = len(words) // batch
    count = (row_length - 1) // time_steps
    rows = np.asarray(words[:batch * row_length], dtype=np.int32).reshape(batch, row_length)
    return np.stack([rows[:, i * time_steps:i * time_steps + time_steps + 1] for i in range(count)])
