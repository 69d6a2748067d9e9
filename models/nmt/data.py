"""Parallel text for NMT: reading, tokenization, vocabularies and a bucketed `tf.data` pipeline.

A corpus is two UTF-8 files with one sentence per line, line i of the source
translating line i of the target. Batches are
(source, source_length, target_in, target_out, target_length), int32, padded
with 0: target_in starts with <s>, target_out ends with </s>.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Iterable, Sequence

import tensorflow as tf

__all__ = ["PAD", "UNK", "BOS", "EOS", "Vocabulary", "detokenize", "make_dataset", "read_parallel", "tokenize"]

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
_SPECIALS = (PAD, UNK, BOS, EOS)
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_NO_SPACE_BEFORE = re.compile(r" ([.,!?;:%)\]}'])")
_NO_SPACE_AFTER = re.compile(r"([(\[{]) ")


def tokenize(sentence: str) -> list[str]:
    """Lower-cased words and single punctuation marks."""
    return _TOKEN.findall(sentence.lower())


def detokenize(tokens: Iterable[str]) -> str:
    """Tokens joined by spaces, without the space before closing punctuation or after opening brackets."""
    return _NO_SPACE_AFTER.sub(r"\1", _NO_SPACE_BEFORE.sub(r"\1", " ".join(tokens)))


class Vocabulary:
    """Token <-> id, ids 0-3 for <pad>, <unk>, <s>, </s>; the rest by frequency (ties alphabetical)."""

    def __init__(self, tokens: Sequence[str]) -> None:
        if tuple(tokens[:4]) != _SPECIALS or len(set(tokens)) != len(tokens):
            raise ValueError(f"a vocabulary starts with {_SPECIALS} and has no duplicate tokens")
        self.tokens = list(tokens)
        self._ids = {token: i for i, token in enumerate(self.tokens)}

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], max_size: int) -> "Vocabulary":
        """The `max_size` - 4 most frequent tokens of tokenized `sentences`, after the 4 special tokens."""
        if max_size < 5:
            raise ValueError(f"max_size must be at least 5 (4 special tokens and one word), got {max_size}")
        counts = collections.Counter(token for sentence in sentences for token in sentence)
        for special in _SPECIALS:
            counts.pop(special, None)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: max_size - len(_SPECIALS)]
        return cls(list(_SPECIALS) + [token for token, _ in ranked])

    @classmethod
    def load(cls, path: str) -> "Vocabulary":
        with open(path, encoding="utf-8") as lines:
            return cls([line.rstrip("\n") for line in lines])

    def save(self, path: str) -> None:
        """Write one token per line; the file appears whole or not at all."""
        with open(path + ".partial", "w", encoding="utf-8") as out:
            out.writelines(token + "\n" for token in self.tokens)
        os.replace(path + ".partial", path)

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        unknown = self._ids[UNK]
        return [self._ids.get(token, unknown) for token in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens up to the first </s>, without padding or <s>."""
        tokens = []
        for i in ids:
            token = self.tokens[int(i)] if 0 <= int(i) < len(self.tokens) else UNK
            if token == EOS:
                break
            if token not in (PAD, BOS):
                tokens.append(token)
        return tokens


def read_parallel(source_path: str, target_path: str) -> list[tuple[str, str]]:
    """(source, target) sentence pairs of two line-aligned files.

    Raises FileNotFoundError for a missing file, ValueError when the line counts
    differ or a line is empty (naming the file and line).
    """
    sides = []
    for path in (source_path, target_path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"corpus file {path!r} does not exist")
        with open(path, encoding="utf-8") as lines:
            sides.append([line.rstrip("\n") for line in lines])
    source, target = sides
    if len(source) != len(target):
        raise ValueError(f"{source_path!r} has {len(source)} lines but {target_path!r} has {len(target)}; "
                         "line i of the source must translate line i of the target")
    for path, lines in ((source_path, source), (target_path, target)):
        for number, line in enumerate(lines, 1):
            if not line.strip():
                raise ValueError(f"line {number} of {path!r} is empty; remove the pair or fill it in")
    return list(zip(source, target))


def make_dataset(pairs: Sequence[tuple[str, str]], source_vocab: Vocabulary, target_vocab: Vocabulary,
                 batch_size: int, max_length: int | None = None, bucket_width: int = 10,
                 shuffle_seed: int | None = 0, drop_remainder: bool = False) -> tf.data.Dataset:
    """Batches of encoded pairs, bucketed by length so that padding stays small.

    Pairs whose source or target is longer than `max_length` tokens are dropped
    (None keeps all). Shuffled with `shuffle_seed` (None: corpus order).
    drop_remainder: drop each bucket's last partial batch and pad every batch to
    its bucket's boundary, so batch shapes repeat (one per bucket), as a step
    optimized per shape needs.
    """
    if batch_size < 1 or bucket_width < 1 or (max_length is not None and max_length < 1):
        raise ValueError("batch_size, bucket_width and max_length must be positive")
    encoded = []
    for source, target in pairs:
        source_ids, target_ids = source_vocab.encode(tokenize(source)), target_vocab.encode(tokenize(target))
        if max_length is None or max(len(source_ids), len(target_ids)) <= max_length:
            encoded.append((source_ids, target_ids))
    if not encoded:
        raise ValueError(f"no sentence pair is within max_length={max_length} tokens")
    bos, eos = target_vocab.encode([BOS])[0], target_vocab.encode([EOS])[0]

    def examples():
        for source_ids, target_ids in encoded:
            yield source_ids, [bos] + target_ids, target_ids + [eos]

    ids = tf.TensorSpec([None], tf.int32)
    dataset = tf.data.Dataset.from_generator(examples, output_signature=(ids, ids, ids))
    if shuffle_seed is not None:
        dataset = dataset.shuffle(len(encoded), seed=shuffle_seed, reshuffle_each_iteration=True)
    longest = max(max(len(s), len(t) + 1) for s, t in encoded)
    boundaries = list(range(bucket_width, longest + bucket_width + 1, bucket_width))
    dataset = dataset.bucket_by_sequence_length(
        lambda source, target_in, target_out: tf.maximum(tf.shape(source)[0], tf.shape(target_in)[0]),
        bucket_boundaries=boundaries, bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
        pad_to_bucket_boundary=drop_remainder, drop_remainder=drop_remainder,
    )
    return dataset.map(
        lambda source, target_in, target_out: (
            source, tf.reduce_sum(tf.cast(source > 0, tf.int32), axis=1),
            target_in, target_out, tf.reduce_sum(tf.cast(target_out > 0, tf.int32), axis=1),
        )
    ).prefetch(tf.data.AUTOTUNE)
