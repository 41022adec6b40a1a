"""Proxy sizes as the tables and figures show them: a size's name (an SAE's or transcoder's size
code decoded to w<width>k<k>), a figure's lines and x positions (one line per k of the codes,
at their widths), the size a family is shown at, and the sizes that are the original model
itself."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

EXACT_JSD = 1e-6  # bits: float32 rounding of a full-rank reconstruction, far below any effect


def decode(method: str, size: int) -> tuple[int, int | None]:
    """(width, k) of a size code of the SAE or the transcoder (with several proxies.sae_k a size
    is k * K_BASE + width, decoded by proxies/sae.py's width_and_k; both proxies' SIZE_LABEL is
    sae's), else (size, None): a plain size, or a width whose k is the one configured."""
    from jaxillusions import proxies  # noqa: PLC0415 - imports jax; only for a sized proxy
    from jaxillusions.proxies import sae  # noqa: PLC0415

    if size < sae.K_BASE or method not in proxies.available() or (
            proxies.size_label(method) != sae.SIZE_LABEL):
        return size, None
    return sae.width_and_k(size, 0)


def label(method: str, size: int) -> str:
    """A size in a table: '-' for size 0 (a data-independent proxy), 'w128k8' for a size code
    (`decode`), else the size."""
    if size == 0:
        return "-"
    width, k = decode(method, size)
    return str(size) if k is None else f"w{width}k{k}"


def listed(method: str, sizes: Iterable[int]) -> str:
    """A family's sizes as the console lists them: '[1, 2, 4]', '[w128k8, w256k8]' (`label`;
    0 stays 0 there, a data-independent proxy's one size)."""
    return "[" + ", ".join(label(method, s) if s else "0" for s in sizes) + "]"


def by_k(method: str, sizes: Iterable[int]) -> list[tuple[int | None, list[int]]]:
    """A family's sizes as the lines of a figure, [(k, sizes by width)]: one line (k None), or
    for size codes (`decode`) one line per k."""
    lines: dict = {}
    for size in sorted(sizes, key=lambda s: decode(method, s)[0]):
        lines.setdefault(decode(method, size)[1], []).append(size)
    return sorted(lines.items(), key=lambda line: line[0] or 0)


def widths(method: str, sizes: Iterable[int]) -> list[int]:
    """Where sizes stand on a size axis: the size, or the width of a size code (`decode`)."""
    return [decode(method, s)[0] for s in sizes]


def middle_size(sizes: Iterable[int]) -> int:
    """The size a table or figure shows for a proxy family: the middle of its sorted sizes."""
    sizes = sorted(sizes)
    return sizes[len(sizes) // 2]


def identical_sizes(rows: Sequence[dict]) -> dict[tuple[str, str], set[int]]:
    """{(method, site): sizes > 0 at which the proxy is the original model on every row} for
    each sized family of the rows: the same prediction and accuracy everywhere and JSD at
    float32 rounding (< EXACT_JSD bits), e.g. a full-rank SVD. Figures draw no line for them;
    the headline does not offer them as 'faithful'."""
    same: dict[tuple[str, str, int], bool] = {}
    for r in rows:
        if r["size"] > 0:
            key = (r["method"], r["site"], r["size"])
            same[key] = same.get(key, True) and (
                r["same_pred"] == 1 and r["acc_proxy"] == r["acc_original"]
                and r["jsd"] < EXACT_JSD)
    out: dict[tuple[str, str], set[int]] = {(method, site): set() for method, site, _ in same}
    for (method, site, size), all_same in same.items():
        if all_same:
            out[(method, site)].add(size)
    return out
