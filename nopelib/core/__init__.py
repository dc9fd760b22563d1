"""The objects of the paper: the model, the tasks, the metrics, the probes, the statistics, and the checks of every input."""
