"""Swapping feature maps to host memory: the plan, trigger choice, and the IR rewrite. Free of TensorFlow."""
