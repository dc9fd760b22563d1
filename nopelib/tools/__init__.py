"""Measuring the code itself: the benchmark and the CPU-kernel check."""
