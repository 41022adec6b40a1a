"""What the two lenses share (logit_lens.py, tuned_lens.py): where they read and write.

A lens reads a residual-stream site (its target) and replaces the final residual stream,
`blocks.<last>.resid_post`, by a function of that value; the model's own final layer norm and
unembedding then decode it. The target itself is left unchanged, and the layers in between are
computed but unused (XLA drops them). See proxies/__init__.py, "A lens".
"""

RESIDUAL = ("resid_pre", "resid_mid", "resid_post")


def output_site(site: str, n_layers: int) -> str:
    """The site a lens writes: the final residual stream, which feeds ln_final and the
    unembedding."""
    del site  # every lens writes the same site
    return f"blocks.{n_layers - 1}.resid_post"


def check(method: str, target: str) -> None:
    """One-line ValueError for a target that is not one residual-stream site."""
    site = target.split(" ")[0]
    parts = site.split(".")
    if "+" in site or len(parts) != 3 or parts[0] != "blocks" or parts[2] not in RESIDUAL:
        raise ValueError(f"{method} target {site}: must be one residual-stream site "
                         f"blocks.<layer>.{{{'|'.join(RESIDUAL)}}} (set proxies.{method}_targets)")
