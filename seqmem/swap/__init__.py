"""Swapping feature maps to host memory: plan, triggers, rewrite, backends."""
