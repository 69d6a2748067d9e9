"""Rewrite: a plan applied to the IR (conservation nodes, the pinned order, blocked vocabulary heads).
Free of TensorFlow."""
