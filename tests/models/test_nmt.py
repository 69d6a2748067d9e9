"""models/nmt: the synthetic language, the data pipeline, decoding, BLEU, the training script."""

import json

import numpy as np
import pytest
import tensorflow as tf

from models.nmt import train
from models.nmt.data import BOS, EOS, PAD, UNK, Vocabulary, detokenize, make_dataset, read_parallel, tokenize
from models.nmt.synthetic import generate_pairs, write_corpus
from models.nmt.training import TrainingRun, bleu, corpus_pairs


def test_synthetic_pairs_are_deterministic_and_within_lengths():
    pairs = generate_pairs(50, seed=3, min_length=10, max_length=20)
    assert pairs == generate_pairs(50, seed=3, min_length=10, max_length=20)
    assert pairs != generate_pairs(50, seed=4, min_length=10, max_length=20)
    assert all(10 <= len(source.split()) <= 20 for source, _ in pairs)
    long = generate_pairs(3, seed=0, min_length=380, max_length=400)
    assert all(380 <= len(source.split()) <= 400 for source, _ in long)


def test_synthetic_grammar_reorders_and_agrees():
    for source, target in generate_pairs(200, seed=1, min_length=4, max_length=40):
        source_clauses, target_clauses = source.split(" and "), target.split(" to ")
        assert len(source_clauses) == len(target_clauses)
        for source_clause, target_clause in zip(source_clauses, target_clauses):
            words = target_clause.split()
            assert words.count("ga") == 1 and words[-2] == "o"  # subject ga object o verb: SOV
            subject = words[: words.index("ga")]
            plural_subject = subject[-1] == "ra"
            assert words[-1].endswith("ran" if plural_subject else "ru")  # verb agrees with the subject
            assert (source_clause.split()[0] == "a") <= (not plural_subject)  # "a" only before a singular


def test_tokenize_and_detokenize():
    assert tokenize("The cat, the DOG (and a bird)!") == ["the", "cat", ",", "the", "dog", "(", "and", "a", "bird", ")", "!"]
    assert detokenize(tokenize("the cat, the dog (and a bird)!")) == "the cat, the dog (and a bird)!"


def test_vocabulary_caps_size_and_round_trips(tmp_path):
    vocab = Vocabulary.build([["b", "a", "b", "c"], ["b", "a", "d"]], max_size=6)
    assert vocab.tokens == [PAD, UNK, BOS, EOS, "b", "a"]  # by frequency, ties alphabetical, capped
    assert vocab.encode(["a", "zebra", "b"]) == [5, 1, 4]
    assert vocab.decode([2, 4, 5, 3, 4, 0]) == ["b", "a"]  # stops at </s>, drops <s>
    vocab.save(str(tmp_path / "vocab.txt"))
    assert Vocabulary.load(str(tmp_path / "vocab.txt")).tokens == vocab.tokens
    with pytest.raises(ValueError, match="at least 5"):
        Vocabulary.build([["a"]], max_size=4)


def test_read_parallel_bad_input(tmp_path):
    (tmp_path / "a.src").write_text("one\ntwo\n")
    (tmp_path / "a.tgt").write_text("eins\n")
    with pytest.raises(FileNotFoundError, match="missing.src"):
        read_parallel(str(tmp_path / "missing.src"), str(tmp_path / "a.tgt"))
    with pytest.raises(ValueError, match="has 2 lines but .* has 1"):
        read_parallel(str(tmp_path / "a.src"), str(tmp_path / "a.tgt"))
    (tmp_path / "a.tgt").write_text("eins\n  \n")
    with pytest.raises(ValueError, match="line 2 of .*a.tgt.* is empty"):
        read_parallel(str(tmp_path / "a.src"), str(tmp_path / "a.tgt"))
    (tmp_path / "a.tgt").write_text("eins\nzwei\n")
    assert read_parallel(str(tmp_path / "a.src"), str(tmp_path / "a.tgt")) == [("one", "eins"), ("two", "zwei")]


def test_dataset_pads_buckets_and_marks_sentences(tmp_path):
    paths = write_corpus(str(tmp_path), {"train": 60}, seed=0, max_length=25)
    pairs = read_parallel(*paths["train"])
    source_vocab = Vocabulary.build((tokenize(s) for s, _ in pairs), 100)
    target_vocab = Vocabulary.build((tokenize(t) for _, t in pairs), 100)
    seen = 0
    for source, source_length, target_in, target_out, target_length in make_dataset(
            pairs, source_vocab, target_vocab, batch_size=8, shuffle_seed=None, bucket_width=5):
        assert source.dtype == tf.int32 and source.shape[0] <= 8
        assert np.all(target_in[:, 0].numpy() == target_vocab.encode([BOS])[0])
        for row, length in zip(target_out.numpy(), target_length.numpy()):
            assert row[length - 1] == target_vocab.encode([EOS])[0] and np.all(row[length:] == 0)
        for row, length in zip(source.numpy(), source_length.numpy()):
            assert np.all(row[:length] > 0) and np.all(row[length:] == 0)
        seen += source.shape[0]
    assert seen == len(pairs)
    fixed = make_dataset(pairs, source_vocab, target_vocab, batch_size=8, bucket_width=10, drop_remainder=True)
    shapes = {tuple(batch[0].shape) for batch in fixed}
    assert all(shape[0] == 8 and shape[1] % 10 == 9 for shape in shapes)  # padded to bucket boundaries


class _Oracle:
    """A 'model' that translates by looking the reference up: BLEU must be 100."""

    def __init__(self, pairs, source_vocab, target_vocab):
        self.table = {tuple(source_vocab.encode(tokenize(s))): target_vocab.encode(tokenize(t)) for s, t in pairs}

    def translate(self, source, source_length, bos_id, eos_id, max_length, beam_width=1):
        rows = [self.table[tuple(row[:length])] + [eos_id] for row, length in zip(source.numpy(), source_length.numpy())]
        width = max(map(len, rows))
        return tf.constant([row + [0] * (width - len(row)) for row in rows])


def test_bleu_is_wired_to_sacrebleu():
    pairs = generate_pairs(30, seed=5, max_length=15)
    source_vocab = Vocabulary.build((tokenize(s) for s, _ in pairs), 200)
    target_vocab = Vocabulary.build((tokenize(t) for _, t in pairs), 200)
    assert bleu(_Oracle(pairs, source_vocab, target_vocab), pairs, source_vocab, target_vocab) == pytest.approx(100.0)


def test_efficient_cells_load_the_keras_models_checkpoint_and_give_its_gradients(tmp_path):
    from models.nmt.model import NMTConfig, NMTModel, masked_cross_entropy

    rng = np.random.default_rng(0)
    source, target = (tf.constant(rng.integers(1, 30, (3, 6)), tf.int32) for _ in range(2))
    lengths = tf.constant([6, 4, 5])
    results = []
    for cells in ("keras", "efficient"):
        model = NMTModel(NMTConfig(30, 30, units=8, cells=cells, layers=2, bidirectional=True))
        model(source, lengths, target)  # builds the variables
        checkpoint = tf.train.Checkpoint(model=model)
        if cells == "keras":
            path = checkpoint.write(str(tmp_path / "keras"))
        else:
            checkpoint.read(path).assert_consumed()
        with tf.GradientTape() as tape:
            loss = masked_cross_entropy(target, model(source, lengths, target)[0], lengths)
        gradients = tape.gradient(loss, model.trainable_variables)
        results.append([loss.numpy()] + [tf.convert_to_tensor(g).numpy() for g in gradients])
    for keras, efficient in zip(*results):
        np.testing.assert_allclose(efficient, keras, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="cells must be one of"):
        NMTConfig(cells="cudnn")


def test_blocked_loss_loads_the_keras_models_checkpoint_and_gives_its_loss_and_gradients(tmp_path):
    from models.nmt.model import NMTConfig, NMTModel, masked_cross_entropy, masked_mean

    rng = np.random.default_rng(1)
    source, target_in, target_out = (tf.constant(rng.integers(1, 30, (3, 6)), tf.int32) for _ in range(3))
    lengths = tf.constant([6, 4, 5])
    results = []
    for loss in ("keras", "efficient"):
        model = NMTModel(NMTConfig(30, 30, units=8, loss=loss))
        model.build_variables()
        checkpoint = tf.train.Checkpoint(model=model)
        if loss == "keras":
            path = checkpoint.write(str(tmp_path / "keras"))
        else:
            checkpoint.read(path).assert_consumed()
        with tf.GradientTape() as tape:
            mean = masked_mean(model.token_losses(source, lengths, target_in, target_out), lengths)
        gradients = tape.gradient(mean, model.trainable_variables)
        results.append([mean.numpy()] + [tf.convert_to_tensor(g).numpy() for g in gradients])
        if loss == "keras":  # token_losses is the masked cross-entropy of call's logits
            logits, _ = model(source, lengths, target_in)
            assert mean.numpy() == masked_cross_entropy(target_out, logits, lengths).numpy()
    for keras, efficient in zip(*results):
        np.testing.assert_allclose(efficient, keras, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="loss must be one of"):
        NMTConfig(loss="sampled")


@pytest.mark.slow
def test_training_learns_the_synthetic_language_and_decodes(tmp_path):
    args = train._parse(["--synthetic", "--out", str(tmp_path), "--steps", "300", "--eval-every", "300",
                         "--units", "96", "--synthetic-size", "2000", "--max-length", "20"])
    run = TrainingRun(args, *corpus_pairs(args))
    log = run.train()
    assert log["loss"][-1]["loss"] < log["loss"][0]["loss"] / 3
    greedy = log["bleu"][-1]["bleu"]
    assert greedy > 40  # measured 85 at 300 steps with units 128; the model learns the language
    beam = bleu(run.model, run.valid_pairs, run.source_vocab, run.target_vocab, beam_width=3)
    assert beam > greedy - 5  # beam search finds translations at least about as good
    assert run.checkpoints.latest_checkpoint and (tmp_path / "vocab.src").exists()


@pytest.mark.slow
def test_the_transformer_learns_the_synthetic_language(tmp_path):
    args = train._parse(["--synthetic", "--out", str(tmp_path), "--architecture", "transformer", "--steps", "200",
                         "--eval-every", "200", "--units", "64", "--layers", "1", "--synthetic-size", "1000",
                         "--max-length", "20", "--dropout", "0"])
    log = TrainingRun(args, *corpus_pairs(args)).train()
    assert log["loss"][-1]["loss"] < log["loss"][0]["loss"] / 3
    assert log["bleu"][-1]["bleu"] > 20


def test_train_script_bad_input(tmp_path, capsys):
    assert train.main(["--train-prefix", str(tmp_path / "nope"), "--valid-prefix", str(tmp_path / "nope"),
                       "--out", str(tmp_path / "run")]) == 2
    assert "does not exist" in capsys.readouterr().err
    for argv in (["--out", "x"], ["--synthetic", "--out", "x", "--swap"], ["--synthetic", "--out", "x", "--steps", "0"],
                 ["--synthetic", "--out", "x", "--attention", "luong"], ["--train-prefix", "a", "--out", "x"],
                 ["--synthetic", "--out", "x", "--frobnicate"], ["--synthetic", "--out", "x", "--kinds", "fold"],
                 ["--synthetic", "--out", "x", "--architecture", "transformer", "--units", "30", "--heads", "4"],
                 ["--synthetic", "--out", "x", "--architecture", "transformer", "--beam-width", "3"],
                 ["--synthetic", "--out", "x", "--architecture", "transformer", "--dropout", "1.5"]):
        with pytest.raises(SystemExit) as exit_info:
            train.main(argv)
        assert exit_info.value.code == 2


def test_train_script_reports_a_budget_no_plan_fits(tmp_path, capsys, monkeypatch):
    from seqmem.errors import InfeasibleBudgetError
    from seqmem.runtime import device

    def infeasible(self):
        raise InfeasibleBudgetError("smallest achievable peak is 102.2 MB (StatelessWhile 'x'); budget was 80.0 MB.")

    monkeypatch.setattr(device, "configure_emulated_device", lambda budget_mb: None)  # TF is already running here
    monkeypatch.setattr(TrainingRun, "train", infeasible)
    argv = ["--synthetic", "--synthetic-size", "50", "--out", str(tmp_path / "run"), "--memory-budget-mb", "80", "--swap"]
    assert train.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --swap under 80 MB: smallest achievable peak is 102.2 MB") and "Traceback" not in err
    assert not (tmp_path / "run" / "log.json").exists()


@pytest.mark.parametrize("argv", [["--time-steps", "50,x"], ["--budget-mb", "0"], ["--precision", "2"], ["--nope"],
                                  ["--variants", "swap,both"], ["--variants", "base,fast"], ["--runs", "0"],
                                  ["--executor", "gpu"], ["--at-batch", "0"], ["--measure-runs", "0"]])
def test_benchmark_bad_flags(argv, capsys):
    from models.nmt import benchmark

    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(argv)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--steps-of", "gru"], ["--steps-of", ""], ["--runs", "0"], ["--steps", "0"],
                                  ["--executor", "gpu"], ["--batch", "0"]])
def test_loop_peaks_bad_flags(argv, capsys):
    from models.nmt import loop_peaks

    with pytest.raises(SystemExit) as exit_info:
        loop_peaks.main(argv)
    assert exit_info.value.code == 2 and "usage:" in capsys.readouterr().err


def test_loop_peaks_row_reports_the_spread_in_mb():
    from models.nmt.loop_peaks import format_row

    row = format_row("tfa", "bounded to 1", 2, {"peak_bytes": [73 << 20, 71 << 20, 72 << 20],
                                                 "median_step_s": 0.4, "predicted_peak_bytes": 87 << 20})
    assert row == "| tfa | bounded to 1 | 2 | 71.0 | 72.0 | 73.0 | 87.0 | 400 |"


def test_benchmark_at_a_given_batch_measures_each_variant_in_alternating_fresh_processes(tmp_path, monkeypatch,
                                                                                         capsys):
    from models.nmt import benchmark
    from seqmem.bench import suite
    from seqmem.runtime.device import BudgetRun

    calls = []

    def fake_run_with_budget(function, variant, batch, *args, budget_mb, timeout_s, one_stream):
        calls.append((function.__name__, variant, batch, budget_mb, one_stream))
        rate = {"base": 1000.0, "swap": 900.0 + len(calls)}[variant]
        return BudgetRun("ok", value={"peak_bytes": 300 << 20, "predicted_peak_bytes": 290 << 20, "swaps": 0,
                                      "median_step_s": 1.0, "tokens_per_s": rate})

    monkeypatch.setattr(suite, "run_with_budget", fake_run_with_budget)
    argv = ["--time-steps", "50", "--at-batch", "223", "--measure-runs", "3", "--variants", "swap,base",
            "--executor", "one-stream", "--out", str(tmp_path)]
    assert benchmark.main(argv) == 0
    # no batch search: base and swap alternate, three rounds, at the batch given, in twice the budget
    assert calls == [("measure", variant, 223, 2048, True) for _ in range(3) for variant in ("base", "swap")]
    (row,) = json.loads((tmp_path / "nmt-benchmark.json").read_text())["rows"]
    assert row["batch"] == {} and row["measured_at"] == 223
    assert row["at_base"]["swap"]["tokens_per_s"] == 904.0
    assert [run["tokens_per_s"] for run in row["at_base"]["swap"]["runs"]] == [902.0, 904.0, 906.0]
    printed = capsys.readouterr().out
    assert "Largest batch" not in printed and "| 50 | 223 | 300 (290), 0 swaps, 1000 tok/s (1.00x)" in printed
    assert "904 tok/s (0.90x) [902 / 904 / 906]" in printed
    assert not (tmp_path / "nmt-batch.png").exists()
