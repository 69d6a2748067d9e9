"""The NMT training loop behind `python -m models.nmt.train`: data, steps, BLEU, checkpoints."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import sacrebleu
import tensorflow as tf
from tqdm import tqdm

from models.nmt.data import BOS, EOS, Vocabulary, detokenize, make_dataset, read_parallel, tokenize
from models.nmt.model import NMTConfig, NMTModel, masked_mean
from models.nmt.synthetic import write_corpus

__all__ = ["TrainingRun", "bleu", "corpus_pairs"]


def corpus_pairs(args: argparse.Namespace) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Training and validation pairs: the files named by the arguments, or a synthetic corpus written under --out."""
    if args.synthetic:
        paths = write_corpus(os.path.join(args.out, "data"), {"train": args.synthetic_size, "valid": 200},
                             seed=args.seed, max_length=min(args.max_length, 30))
        prefixes = [p[0][: -len(".src")] for p in (paths["train"], paths["valid"])]
    else:
        prefixes = [args.train_prefix, args.valid_prefix]
    return tuple(read_parallel(prefix + ".src", prefix + ".tgt") for prefix in prefixes)


def bleu(model: NMTModel, pairs: Sequence[tuple[str, str]], source_vocab: Vocabulary, target_vocab: Vocabulary,
         batch_size: int = 64, beam_width: int = 1) -> float:
    """Corpus BLEU (sacrebleu) of the model's translations of `pairs`' sources against their targets."""
    dataset = make_dataset(pairs, source_vocab, target_vocab, batch_size, shuffle_seed=None, bucket_width=1000)
    hypotheses, references = [], []
    bos, eos = target_vocab.encode([BOS])[0], target_vocab.encode([EOS])[0]
    beam = {} if beam_width == 1 else {"beam_width": beam_width}  # the Transformer decodes greedily only
    for source, source_length, _, target_out, _ in dataset:
        ids = model.translate(source, source_length, bos, eos, max_length=2 * int(source.shape[1]) + 10, **beam)
        hypotheses += [detokenize(target_vocab.decode(row)) for row in ids.numpy()]
        references += [detokenize(target_vocab.decode(row)) for row in target_out.numpy()]
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


def _model(args: argparse.Namespace, source_vocab: int, target_vocab: int):
    """The model --architecture names, sized by the arguments."""
    if args.architecture == "lstm":
        return NMTModel(NMTConfig(source_vocab, target_vocab, args.units, args.attention, layers=args.layers,
                                  bidirectional=args.bidirectional, cells=args.cells, loss=args.loss))
    from models.transformer.model import TransformerConfig, TransformerModel

    return TransformerModel(TransformerConfig(
        source_vocab=source_vocab, target_vocab=target_vocab, model_dim=args.units, heads=args.heads,
        layers=args.layers, feed_forward=4 * args.units, dropout=args.dropout,
        max_length=2 * args.max_length + 12,  # translations of up to 2 x the source + 10 tokens
        attention="keras" if args.attention == "tfa" else "efficient", loss=args.loss))


class TrainingRun:
    """Model, optimizer, vocabularies and checkpoint of one training run (arguments as `models.nmt.train` parses)."""

    def __init__(self, args: argparse.Namespace, train_pairs, valid_pairs) -> None:
        self.args, self.valid_pairs = args, valid_pairs
        if args.deterministic:
            tf.config.experimental.enable_op_determinism()
        tf.keras.utils.set_random_seed(args.seed)
        self.source_vocab = Vocabulary.build((tokenize(s) for s, _ in train_pairs), args.vocab_size)
        self.target_vocab = Vocabulary.build((tokenize(t) for _, t in train_pairs), args.vocab_size)
        self.source_vocab.save(os.path.join(args.out, "vocab.src"))
        self.target_vocab.save(os.path.join(args.out, "vocab.tgt"))
        self.dataset = make_dataset(train_pairs, self.source_vocab, self.target_vocab, args.batch_size,
                                    max_length=args.max_length, shuffle_seed=args.seed, drop_remainder=True)
        self.model = _model(args, len(self.source_vocab), len(self.target_vocab))
        self.optimizer = tf.keras.optimizers.Adam(args.learning_rate)
        self.model.build_variables()  # as make_train_step: the step then traces once
        self.optimizer.build(self.model.trainable_variables)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step)
        self.checkpoints = tf.train.CheckpointManager(checkpoint, os.path.join(args.out, "checkpoints"), max_to_keep=2)
        self._train_step = tf.function(self._step_function, autograph=False)  # as make_train_step
        self._optimized: dict[tuple, Any] = {}

    def _step_function(self, source, source_length, target_in, target_out, target_length):
        training = {"training": True} if self.args.architecture == "transformer" else {}  # its dropout
        with tf.GradientTape() as tape:
            loss = masked_mean(self.model.token_losses(source, source_length, target_in, target_out, **training),
                               target_length)
        variables = self.model.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    def _runner(self, batch):
        """The training step for this batch's shapes: seqmem-optimized (cached per shape) with --swap."""
        if not self.args.swap:
            return self._train_step
        key = tuple(tuple(t.shape) for t in batch)
        if key not in self._optimized:
            from seqmem.runtime.optimize import optimize

            specs = [tf.TensorSpec(t.shape, t.dtype) for t in batch]
            self._optimized[key] = optimize(self._train_step, self.args.memory_budget_mb, input_signature=specs,
                                           sample_inputs=batch, kinds=self.args.kinds)
        return self._optimized[key]

    def train(self) -> dict[str, Any]:
        """Train to --steps (resuming from the latest checkpoint); returns {"loss": [...], "bleu": [...]}."""
        if self.checkpoints.latest_checkpoint:
            self.checkpoints.checkpoint.restore(self.checkpoints.latest_checkpoint)
        log: dict[str, Any] = {"loss": [], "bleu": [], "swapped_shapes": 0}
        batches = iter(self.dataset.repeat())
        with tqdm(total=self.args.steps, initial=int(self.step.numpy()), desc="training", unit="step") as progress:
            while int(self.step.numpy()) < self.args.steps:
                batch = next(batches)
                loss = float(self._runner(batch)(*batch))
                self.step.assign_add(1)
                step = int(self.step.numpy())
                log["loss"].append({"step": step, "loss": loss})
                progress.set_postfix(loss=f"{loss:.3f}")
                progress.update(1)
                if step % self.args.eval_every == 0 or step == self.args.steps:
                    score = bleu(self.model, self.valid_pairs, self.source_vocab, self.target_vocab,
                                 beam_width=self.args.beam_width)
                    log["bleu"].append({"step": step, "bleu": score})
                    progress.write(f"step {step}: loss {loss:.3f}, validation BLEU {score:.1f}")
                    self.checkpoints.save(checkpoint_number=step)
        log["swapped_shapes"] = sum(bool(s.plan.decisions) for s in self._optimized.values())
        log["blocked_head_shapes"] = sum(bool(s.plan.blocked_heads) for s in self._optimized.values())
        return log
