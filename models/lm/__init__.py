"""A word-level LSTM language model (the paper's Table 2(a) setting) and its benchmark."""
