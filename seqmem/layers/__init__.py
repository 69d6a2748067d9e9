"""Drop-in Keras layers and losses that hold less memory in training: `MemoryEfficientBahdanauAttention`
(`attention`), `MemoryEfficientMultiHeadAttention` (`multi_head_attention`, over `blocked_attention`),
`MemoryEfficientLSTM` / `MemoryEfficientGRU` (`recurrent`, over `lstm_sequence`), and the blocked vocabulary
loss (`softmax_loss`). Each module imports TensorFlow; this package does not."""
