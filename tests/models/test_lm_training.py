"""models/lm: the PTB-format reader, the synthetic Markov source, the model's argument checks, and the
training run with and without seqmem."""

import json
import re

import numpy as np
import pytest

from models.lm import train
from models.lm.corpus import EOS, MarkovSource, read_ptb, window_count, windows


def write_ptb(folder, train_text, valid_text, test_text=None):
    folder.mkdir(exist_ok=True)
    (folder / "ptb.train.txt").write_text(train_text)
    (folder / "ptb.valid.txt").write_text(valid_text)
    if test_text is not None:
        (folder / "ptb.test.txt").write_text(test_text)
    return str(folder)


def test_read_ptb_builds_tf_lms_vocabulary_and_ends_every_line_with_eos(tmp_path):
    folder = write_ptb(tmp_path / "ptb", " the cat <unk> the\n dog the cat\n", " the dog\n the bird \n")
    corpus = read_ptb(folder)
    # counts: the 3, <eos> 2, cat 2, <unk> 1, dog 1; ties by the word
    assert corpus.vocabulary == ("the", EOS, "cat", "<unk>", "dog")
    assert corpus.train.dtype == np.int32 and corpus.train.tolist() == [0, 2, 3, 0, 1, 4, 0, 2, 1]
    assert corpus.valid.tolist() == [0, 4, 1, 0, 3, 1]  # "bird" is not in the training file: <unk>
    assert corpus.test is None
    assert read_ptb(write_ptb(tmp_path / "with-test", "a b\n", "b\n", "a a\n")).test.tolist() == [1, 1, 0]


def test_read_ptb_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="ptb.train.txt .*one sentence a line"):
        read_ptb(str(tmp_path))
    with pytest.raises(ValueError, match="holds no words"):
        read_ptb(write_ptb(tmp_path / "empty", "", "a\n"))
    with pytest.raises(ValueError, match="1 words the training file lacks .*'bird'.*no <unk>"):
        read_ptb(write_ptb(tmp_path / "no-unk", "the cat\n", "the bird\n"))


def test_training_reads_a_ptb_folder_and_has_no_source_floor_there(tmp_path):
    folder = write_ptb(tmp_path / "ptb", "a b c\n" * 50, "c b a\n" * 20)
    train_words, valid_words, floor = train.corpus_words({"data": folder})
    assert floor is None and len(train_words) == 200 and len(valid_words) == 80
    train_words, valid_words, floor = train.corpus_words({"data": None, "vocab": 20, "seed": 0,
                                                          "train_words": 300, "valid_words": 100})
    assert len(train_words) == 300 and len(valid_words) == 100 and floor(valid_words[:-1], valid_words[1:]) > 1


def test_source_is_deterministic_and_its_own_perplexity_is_far_below_a_unigram_models():
    source = MarkovSource(200, successors=6, seed=3)
    words = source.sample(20_000, seed=1)
    assert np.array_equal(words, source.sample(20_000, seed=1))
    assert not np.array_equal(words, source.sample(20_000, seed=2))
    assert words.dtype == np.int32 and 0 <= words.min() and words.max() < 200
    following, probabilities = source.transitions()
    assert np.allclose(probabilities.sum(axis=1), 1.0)
    assert all(len(set(row)) == 6 for row in following.tolist())  # distinct successors
    own = source.perplexity(words[:-1], words[1:])
    counts = np.bincount(words[1:], minlength=200) / (len(words) - 1)
    unigram = float(np.exp(-np.mean(np.log(counts[words[1:]]))))
    assert 1.0 < own < 6.0 < 50.0 < unigram  # below the number of successors; a unigram model far above


def test_perplexity_refuses_a_transition_the_source_never_makes():
    source = MarkovSource(10, successors=2)
    following, _ = source.transitions()
    never = next(word for word in range(10) if word not in following[0])
    with pytest.raises(ValueError, match="never makes"):
        source.perplexity(np.array([0]), np.array([never]))


@pytest.mark.parametrize("options", [{"vocab": 1}, {"vocab": 10, "successors": 1}, {"vocab": 10, "successors": 11},
                                     {"vocab": 10, "concentration": 0.0}])
def test_bad_source_settings_are_value_errors(options):
    with pytest.raises(ValueError, match="MarkovSource needs"):
        MarkovSource(**options)


def test_windows_cut_the_stream_into_rows_of_consecutive_words():
    words = np.arange(100, dtype=np.int32)
    cut = windows(words, batch=4, time_steps=5)  # rows of 25 words: 4 windows of 6 (inputs + next word)
    assert cut.shape == (4, 4, 6)
    assert cut[0, 1].tolist() == [25, 26, 27, 28, 29, 30]
    assert cut[1, 0, 0] == cut[0, 0, -1]  # the next window starts at the last target
    assert window_count(100, 4, 5) == 4 and window_count(100, 50, 5) == window_count(100, 0, 5) == 0
    with pytest.raises(ValueError, match="hold no window"):
        windows(words, batch=50, time_steps=5)


def test_language_model_names_a_bad_cells_or_loss_argument():
    from models.lm.model import language_model

    with pytest.raises(ValueError, match="cells must be one of"):
        language_model(1, 4, 10, cells="cudnn")


@pytest.mark.parametrize("argv", [["--variants", "swap,base"], ["--variants", "base,fast"], ["--steps", "0"],
                                  ["--vocab", "1"], ["--batch-size", "64", "--valid-words", "100"], ["--nope"]])
def test_bad_flags_exit_with_usage_error(argv, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--out", str(tmp_path)] + argv)
    assert exit_info.value.code == 2 and "usage:" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("argv, message", [
    (["--data", "{missing}"], "--data: no .*ptb.train.txt"),
    (["--data", "{ptb}", "--vocab", "50"], "with --data the vocabulary is the training file's"),
    (["--data", "{ptb}", "--batch-size", "8"], "ptb.valid.txt \\(6 words\\) must hold one window"),
])
def test_bad_data_flags_exit_with_usage_error(argv, message, capsys, tmp_path):
    ptb = write_ptb(tmp_path / "ptb", "a b c\n" * 100, "c b\n" * 2)
    out = tmp_path / "out"
    argv = [arg.format(missing=tmp_path / "missing", ptb=ptb) for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--out", str(out)] + argv)
    assert exit_info.value.code == 2 and re.search(message, capsys.readouterr().err)
    assert not out.exists()  # nothing written


@pytest.mark.device
def test_training_curves_match_bit_for_bit_with_swaps_and_to_float_rounding_with_efficient_cells(tmp_path, capsys):
    assert train.main(["--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "lm-training.json").read_text())
    runs = report["runs"]
    assert list(runs) == ["base", "efficient", "swap"]
    assert runs["swap"]["swaps"] > 0 and runs["swap"]["peak_bytes"] < runs["base"]["peak_bytes"]
    assert runs["swap"]["losses"] == runs["base"]["losses"]  # bit for bit
    assert runs["swap"]["perplexities"] == runs["base"]["perplexities"]
    # efficient cells: the same weights, gates recomputed in backward (bit for bit in this run, 2026-11-25;
    # the contract is float rounding, compounded by SGD)
    assert train.loss_distance(runs["efficient"]["losses"], runs["base"]["losses"]) < 1e-5
    base = runs["base"]["perplexities"]
    assert base[-1]["perplexity"] < base[0]["perplexity"]  # it learns
    assert runs["base"]["source_perplexity"] < base[-1]["perplexity"]
    assert (tmp_path / "lm-perplexity.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "| swap |" in printed and "0 (bit for bit)" in printed
