"""Analysis of a captured step: its anatomy (loss, forward, backward), critical-path timing, and the
`StepAnalysis` the planner reads. Free of TensorFlow."""
