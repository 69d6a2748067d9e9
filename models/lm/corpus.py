"""Word streams for the language model: PTB-format text files, or a synthetic source that needs no download.

`read_ptb` reads a folder in the Penn Treebank layout TF-LM reads
(`ptb.train.txt`, `ptb.valid.txt`, optionally `ptb.test.txt`: one sentence a
line, words separated by spaces, each line ended by `<eos>`), with TF-LM's
vocabulary: the training file's words, most frequent first.

`MarkovSource`'s words come from a first-order Markov source: each of `vocab` words is
followed by one of `successors` words (always including the next word id, so
every word is reachable), with probabilities drawn from a Dirichlet
distribution. A model that learns the source exactly reaches the source's own
perplexity on held-out words (`MarkovSource.perplexity`); a unigram model stays
far above it. Deterministic by seed.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass

import numpy as np

__all__ = ["EOS", "PTB_FILES", "MarkovSource", "TextCorpus", "read_ptb", "window_count", "windows"]

EOS = "<eos>"
UNKNOWN = "<unk>"
PTB_FILES = {"train": "ptb.train.txt", "valid": "ptb.valid.txt", "test": "ptb.test.txt"}


@dataclass(frozen=True)
class TextCorpus:
    """Word ids ([words] int32) of the training, validation and (if there was one) test text, and the
    vocabulary: `vocabulary[i]` is the word of id i."""

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray | None
    vocabulary: tuple[str, ...]


def read_ptb(directory: str) -> TextCorpus:
    """The PTB-format corpus in `directory`, as TF-LM reads it: every line's words then `<eos>`; the
    vocabulary is every word of the training file, by decreasing count, ties by the word.

    A validation or test word the training file lacks becomes `<unk>` when the vocabulary has it (PTB's
    files are already mapped so); otherwise raises ValueError naming it. Raises FileNotFoundError when
    `directory` lacks ptb.train.txt or ptb.valid.txt, ValueError when the training file has no words.
    """
    paths = {part: os.path.join(directory, name) for part, name in PTB_FILES.items()}
    missing = [paths[part] for part in ("train", "valid") if not os.path.isfile(paths[part])]
    if missing:
        raise FileNotFoundError(f"no {' or '.join(missing)}: a PTB-format folder holds ptb.train.txt and "
                                f"ptb.valid.txt (and optionally ptb.test.txt), one sentence a line")
    train_words = _words(paths["train"])
    if not train_words:
        raise ValueError(f"{paths['train']} holds no words")
    counts = collections.Counter(train_words)
    vocabulary = tuple(sorted(counts, key=lambda word: (-counts[word], word)))
    ids = {word: index for index, word in enumerate(vocabulary)}

    def word_ids(path: str, words: list[str]) -> np.ndarray:
        unknown = ids.get(UNKNOWN)
        missing_words = sorted({word for word in words if word not in ids})
        if missing_words and unknown is None:
            raise ValueError(f"{path} has {len(missing_words)} words the training file lacks (e.g. "
                             f"{missing_words[0]!r}) and the vocabulary has no {UNKNOWN} to map them to")
        return np.array([ids.get(word, unknown) for word in words], dtype=np.int32)

    test = _words(paths["test"]) if os.path.isfile(paths["test"]) else None
    return TextCorpus(word_ids(paths["train"], train_words), word_ids(paths["valid"], _words(paths["valid"])),
                      None if test is None else word_ids(paths["test"], test), vocabulary)


def _words(path: str) -> list[str]:
    """The words of a text file, `<eos>` after each line, blank lines included. TF-LM puts one `<eos>` per
    newline: the same words for a file that ends with a newline, as PTB's do; one `<eos>` more at the end
    here for a file that does not."""
    with open(path, encoding="utf-8") as text:
        return [word for line in text for word in line.split() + [EOS]]


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


def window_count(words: int, batch: int, time_steps: int) -> int:
    """How many windows `windows` cuts from a stream of `words` words (0 for a nonpositive batch or steps)."""
    if batch < 1 or time_steps < 1:
        return 0
    return max(0, (words // batch - 1) // time_steps)


def windows(words: np.ndarray, batch: int, time_steps: int) -> np.ndarray:
    """The stream cut as TF-LM batches it: `batch` rows of consecutive words, then windows of `time_steps` + 1
    words (inputs and the targets one word later) along the rows. Returns [windows, batch, time_steps + 1]
    int32. Raises ValueError when `words` hold no full window."""
    count = window_count(len(words), batch, time_steps)
    if count < 1:
        raise ValueError(f"{len(words)} words hold no window of batch {batch} x {time_steps + 1} steps")
    row_length = len(words) // batch
    rows = np.asarray(words[:batch * row_length], dtype=np.int32).reshape(batch, row_length)
    return np.stack([rows[:, i * time_steps:i * time_steps + time_steps + 1] for i in range(count)])
