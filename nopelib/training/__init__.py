"""How runs train: profiles, the loop, the run cache, the launchers and the time gate."""
