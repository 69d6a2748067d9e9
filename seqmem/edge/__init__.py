"""The TensorFlow edge: capture (TF objects <-> IR), scratch probes, op traces, swap nodes. Every module here imports TensorFlow."""
