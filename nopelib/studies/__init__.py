"""The study commands, each run by hand and committing a result file, and the probe and early-dynamics tables the chapters compute."""
