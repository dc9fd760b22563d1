"""The objects of the paper: the model, the tasks, the metrics, the probes, the statistics, random models measured, and the checks of every input."""
