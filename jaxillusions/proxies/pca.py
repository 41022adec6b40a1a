"""PCA proxy: the svd proxy on centered activations, x -> mean + P_r (x - mean)."""

import jax

from jaxillusions.proxies import svd

STATISTIC = svd.STATISTIC
SITE = svd.SITE
apply = svd.apply


def fit(stats: dict, sizes: tuple[int, ...], *, key: jax.Array | None = None) -> dict:
    """Moments -> svd params with the mean removed before projecting."""
    return svd.fit(stats, sizes, key=key, center=True)
