"""ResNet builders and benchmarks."""
