"""PCA proxy: the svd proxy on centered activations, x -> mean + P_r (x - mean)."""

import jax

from jaxillusions.proxies import svd

STATISTIC = svd.STATISTIC
SITE = svd.SITE
SIZES_KEY = svd.SIZES_KEY  # the ranks are shared with svd
SIZE_LABEL = svd.SIZE_LABEL
check = svd.check
apply = svd.apply


def settings(proxy_cfg, dim: int) -> tuple[tuple[int, ...], tuple]:
    return svd.ranks(proxy_cfg, dim), ()


def fit(stats: dict, sizes: tuple[int, ...], *, key: jax.Array | None = None) -> dict:
    """Moments -> svd params with the mean removed before projecting."""
    return svd.fit(stats, sizes, key=key, center=True)
