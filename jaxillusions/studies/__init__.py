"""The studies of the main job, one module each: its stage (`STAGE`, studies/stage.py: its
settings section, check, report lines), its maths and its report (Wen et al., induction heads,
fit shift, geometry, dictionaries, probes, circuits)."""
