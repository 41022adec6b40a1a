"""The studies of the main job, one module each: its stage (`STAGE`), its maths and
its report (Wen et al., induction heads, fit shift, geometry, dictionaries,
probes, circuits)."""
