"""Run directories: the run log and checkpoints, the writer's lock, trackers, engines' run directories."""
