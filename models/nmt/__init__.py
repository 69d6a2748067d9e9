"""An attention NMT model (tensorflow-addons seq2seq) and its benchmarks."""
