"""Writes tests/data/minimal_tables.npz: the minimal first layer's fixed tables as the code of
commit c14e60b (before the layer became a part, tasks/minimal_layer.py) built them. Run from the
repository root at that commit: python tests/data/make_minimal_tables.py"""

import numpy as np

from jaxillusions import model

tables = {}
for features in model.MINIMAL_EMBEDDINGS:
    cfg = model.ModelConfig(vocab_size=7, max_len=12, d_model=32, first_layer="minimal",
                            minimal_embedding=features, pos_encoding="none", open_ids=(3, 4),
                            close_ids=(5, 6), max_depth=2, depth_bins=4)
    tables[features] = np.asarray(model.transformer._fixed_table("minimal", cfg))  # noqa: SLF001
np.savez("tests/data/minimal_tables.npz", **tables)
