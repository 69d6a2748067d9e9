"""A synthetic language pair with real structure, so NMT needs no download and long sentences exist.

Source ("English-like"): subject-verb-object clauses joined by "and", adjectives
before the noun, plural nouns take "-s" and the verb agrees with its subject
("the red fox sees a cat" / "the red foxes see a cat").
Target ("Japanese-like"): subject-object-verb with case particles ("ga", "o"),
adjectives after the noun, plural marked by a separate word "ra" after the noun
phrase, verb suffix "-ru" (singular subject) or "-ran" (plural), clauses joined
by "to". Every source word maps to invented target words, so translating needs
the lexicon, reordering inside each clause, agreement and morphology.

Generation is deterministic by seed; sentence lengths are controlled in tokens.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

__all__ = ["Lexicon", "generate_pairs", "write_corpus"]

_NOUNS = ("cat", "dog", "fox", "bird", "horse", "king", "child", "farmer", "river", "tree", "stone", "ship",
          "teacher", "doctor", "garden", "house", "wolf", "bear", "fish", "queen", "city", "road", "book", "lamp")
_ADJECTIVES = ("red", "big", "small", "old", "young", "green", "quiet", "loud", "happy", "dark", "bright", "tired")
_VERBS = ("see", "follow", "help", "find", "carry", "watch", "paint", "call", "push", "love", "feed", "build")
_SYLLABLES = ("ka", "ki", "ko", "sa", "shi", "so", "ta", "te", "to", "na", "ni", "no", "ma", "mi", "mo",
              "ra", "ri", "ro", "ya", "yu", "wa", "ha", "hi", "fu", "be", "do", "gu", "pe")


@dataclass(frozen=True)
class Lexicon:
    """Invented target words for the source vocabulary, fixed by `seed`."""

    seed: int = 0

    def translations(self) -> dict[str, str]:
        rng = random.Random(self.seed)
        words: dict[str, str] = {}
        used = {"ga", "o", "ra", "to"}
        for word in _NOUNS + _ADJECTIVES + _VERBS:
            while True:
                candidate = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
                if candidate not in used:
                    used.add(candidate)
                    words[word] = candidate
                    break
        return words


def _noun_phrase(rng: random.Random, lexicon: dict[str, str], adjectives: int) -> tuple[list[str], list[str], bool]:
    noun, plural = rng.choice(_NOUNS), rng.random() < 0.4
    chosen = rng.sample(_ADJECTIVES, adjectives)
    determiner = "the" if plural or rng.random() < 0.5 else "a"
    source = [determiner] + chosen + [_plural(noun) if plural else noun]
    target = [lexicon[noun]] + [lexicon[a] for a in reversed(chosen)] + (["ra"] if plural else [])
    return source, target, plural


def _plural(noun: str) -> str:
    if noun.endswith(("s", "sh", "ch", "x")):
        return noun + "es"
    if noun == "child":
        return "children"
    return noun[:-1] + "ies" if noun.endswith("y") else noun + "s"


def _third_person(verb: str) -> str:
    if verb.endswith(("sh", "ch", "x")):
        return verb + "es"
    return verb[:-1] + "ies" if verb.endswith("ry") else verb + "s"


def _clause(rng: random.Random, lexicon: dict[str, str], adjectives: int) -> tuple[list[str], list[str]]:
    subject_adjectives = rng.randint(0, adjectives)
    subject, subject_target, plural = _noun_phrase(rng, lexicon, subject_adjectives)
    obj, object_target, _ = _noun_phrase(rng, lexicon, adjectives - subject_adjectives)
    verb = rng.choice(_VERBS)
    source_verb = verb if plural else _third_person(verb)
    target_verb = lexicon[verb] + ("ran" if plural else "ru")
    return subject + [source_verb] + obj, subject_target + ["ga"] + object_target + ["o", target_verb]


def generate_pairs(count: int, seed: int = 0, min_length: int = 4, max_length: int = 30,
                   lexicon_seed: int = 0) -> list[tuple[str, str]]:
    """`count` (source, target) sentence pairs, tokens joined by spaces.

    Source lengths are within [min_length, max_length] tokens (clauses are added
    until the sentence is at least `min_length` long; a clause that would pass
    `max_length` is shortened or dropped). Raises ValueError unless
    1 <= count and 4 <= min_length <= max_length.
    """
    if count < 1 or not 4 <= min_length <= max_length:
        raise ValueError(f"need count >= 1 and 4 <= min_length <= max_length, got {count}, {min_length}, {max_length}")
    rng = random.Random(seed)
    lexicon = Lexicon(lexicon_seed).translations()
    pairs = []
    while len(pairs) < count:
        wanted = rng.randint(min_length, max_length)
        source: list[str] = []
        target: list[str] = []
        while len(source) < wanted:
            room = wanted - len(source) - (1 if source else 0)  # "and" between clauses
            if room < 5:
                break
            clause_source, clause_target = _clause(rng, lexicon, min(rng.randint(0, 3), room - 5))
            if source:
                source.append("and")
                target.append("to")
            source += clause_source
            target += clause_target
        if min_length <= len(source) <= max_length:
            pairs.append((" ".join(source), " ".join(target)))
    return pairs


def write_corpus(directory: str, sizes: dict[str, int], seed: int = 0, min_length: int = 4,
                 max_length: int = 30) -> dict[str, tuple[str, str]]:
    """Write `<split>.src` / `<split>.tgt` files for each split in `sizes` (e.g. {"train": 5000, "valid": 200}).

    Splits use different seeds. Files appear whole or not at all. Returns
    {split: (source path, target path)}.
    """
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for offset, (split, count) in enumerate(sorted(sizes.items())):
        pairs = generate_pairs(count, seed=seed * 1000 + offset, min_length=min_length, max_length=max_length)
        paths[split] = tuple(os.path.join(directory, f"{split}.{side}") for side in ("src", "tgt"))
        for side, path in zip((0, 1), paths[split]):
            with open(path + ".partial", "w", encoding="utf-8") as out:
                out.writelines(pair[side] + "\n" for pair in pairs)
            os.replace(path + ".partial", path)
    return paths
