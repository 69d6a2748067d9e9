"""What a plan decides, as values every stage after the IR reads: conservation kinds, decisions, the plan.
Free of TensorFlow."""
