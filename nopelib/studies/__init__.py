"""The studies: the commands that train or measure by hand (``python -m nopelib.studies.<command>``) and commit a result file, and the probe and early-dynamics tables the chapters compute."""
