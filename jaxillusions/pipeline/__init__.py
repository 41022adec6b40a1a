"""The main job: the tuple of stages (job.PIPELINE), its runner (sweep.run), its proxy and
reports stages, and the door (validate.check)."""
