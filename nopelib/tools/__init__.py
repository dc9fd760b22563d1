"""Measuring the code itself: the benchmark."""
