"""The memory simulator: live device bytes over a schedule, the BFC allocator model, kernels' scratch. Free of TensorFlow."""
