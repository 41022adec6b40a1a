"""A decoder-only transformer as data plus pure functions.

The transformer itself is transformer.py (re-exported here, its public names: `model.forward`,
`model.ModelConfig`, ...), its parameters params.py (`model.init_params`, ...), its position
encodings positions.py; pretrained.py imports
checkpoints; patching.py patches edges.
"""

from jaxillusions.model.params import (  # noqa: F401
    Params,
    check_params,
    frozen_paths,
    init_params,
    param_shapes,
    path_str,
    random_paths,
    seed_labels,
)
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
    imported_options,
    mlp_input,
    projection,
    residual_site,
    site_names,
    uniform_pattern,
)
