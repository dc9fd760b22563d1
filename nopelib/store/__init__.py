"""Where results are kept: cache folders, run checkpoints, the chapters' results cache, and how keys see the code."""
