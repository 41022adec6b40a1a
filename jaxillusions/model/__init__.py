"""A decoder-only transformer as data plus pure functions.

The transformer itself is transformer.py (re-exported here, its public names: `model.forward`,
`model.ModelConfig`, ...), its position encodings positions.py; pretrained.py imports
checkpoints; patching.py patches edges.
"""

from jaxillusions.model.transformer import (  # noqa: F401 - the package's public names
    ACTIVATIONS,
    COMPUTE_DTYPES,
    EMBEDDINGS,
    IMPORTED_FIELDS,
    POS_ENCODINGS,
    ROTARY_LAYOUTS,
    SETTINGS_FIELDS,
    Intervention,
    ModelConfig,
    Params,
    Part,
    Site,
    Span,
    UniformAttention,
    at_positions,
    attention_pattern,
    before_readout,
    check_site,
    compose,
    first_attention_layer,
    first_block,
    forward,
    frozen_paths,
    imported_options,
    init_params,
    mlp_input,
    path_str,
    projection,
    random_paths,
    residual_site,
    seed_labels,
    site_names,
    uniform_pattern,
)
