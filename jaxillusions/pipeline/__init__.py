"""The main job: the tuple of stages (sweep.PIPELINE), its runner, and the check at
the door (validate.check)."""
