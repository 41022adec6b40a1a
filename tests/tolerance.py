"""Float32 tolerances derived from what is computed, for tests that compare one quantity obtained
two ways: other device layouts or seed chunks (XLA compiles another program, which may round
and order its sums differently), a padded against a narrow program, the engine against a direct
recomputation, or another library. Each way is within its rounding error of the exact value, so
the two differ by at most the sum of both (`two_ways`). The errors are estimated from the
magnitudes of the terms, the number of float32 additions and the conditioning, never from a
difference one machine showed, so that CPUs of every vendor pass by construction.

The model (Higham, Accuracy and Stability of Numerical Algorithms, 2002, ch. 3-4):
- one float32 operation rounds by at most EPS32 / 2 of its result;
- a sum of n float32 terms: rounding errors of random sign accumulate to about
  EPS32 * sqrt(n) * (sum of |terms|) (the statistical estimate; the worst case is n - 1 times
  EPS32 * sum|terms|, which no real reduction approaches);
- a value computed from numbers of magnitude s (a log-softmax from logits, a product of
  activations) carries its own rounding, a few EPS32 * s: `term_ulps` of them;
- a ratio num / den: (error(num) + |num / den| * error(den)) / |den| to first order: large where
  den is small against its error (ill-conditioned), which is why the library reports ratio
  metrics only where the denominator exceeds 1000 times its rounding (dictionary_metrics.py).
"""

from __future__ import annotations

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23
# Roundings one term carries before it is summed: a log-softmax (a max, a sum of exponentials,
# a log, a subtraction) or a short chain of products; 8 covers each with a margin.
TERM_ULPS = 8


def sum_error(n, magnitude):
    """Float32 rounding error of a sum of n terms whose absolute values add up to `magnitude`."""
    return EPS32 * np.sqrt(np.maximum(n, 1)) * np.abs(magnitude)


def mean_error(n, mean_abs, scale):
    """Float32 rounding error of a mean over n positions of terms of mean absolute value
    `mean_abs`, each computed from numbers of magnitude `scale`: the sum's error over n plus
    one term's own rounding (TERM_ULPS * EPS32 * scale, which averaging need not shrink)."""
    return EPS32 * np.sqrt(np.maximum(n, 1)) * np.abs(mean_abs) + TERM_ULPS * EPS32 * np.abs(scale)


def activation_error(x, width):
    """Float32 rounding of activations x [..., F] reached through a few layers of matmuls of
    `width` terms: each layer rounds an output by about EPS32 * sqrt(width) of the magnitude
    of its inputs, the row's norm here, and TERM_ULPS covers the layers, norms and
    nonlinearities on the way. -> [..., 1], per row."""
    norm = np.linalg.norm(np.asarray(x, np.float64), axis=-1, keepdims=True)
    return TERM_ULPS * EPS32 * np.sqrt(width) * norm


def rotation_error(x, max_angle):
    """Float32 rounding of vectors x [..., F] turned by rotary angles of up to `max_angle`
    radians (position times frequency, the highest frequency being 1), the angles computed in
    float32 (a power, a reciprocal, a product: TERM_ULPS roundings of the angle cover them) or
    in float64 and rounded once: each cos and sin is off by at most TERM_ULPS * EPS32 *
    max_angle plus its own rounding, EPS32, and a pair turned with them by twice that of its
    norm. -> [..., 1], per row."""
    norm = np.linalg.norm(np.asarray(x, np.float64), axis=-1, keepdims=True)
    return 2 * (TERM_ULPS * EPS32 * max(max_angle, 1.0) + EPS32) * norm


def softmax_error(p, scores, score_error):
    """Float32 error of p = softmax(scores) over the last axis [..., K] when each score is known
    within `score_error` (broadcastable to it; masked scores, -inf, have p = 0 and no error).
    To first order p_j moves by p_j (|d_j| + sum_k p_k |d_k|), where d is the score error plus
    the rounding of s - max(s) (EPS32 of it); the softmax's own roundings (an exponential, a
    sum of K terms, a division) add p_j (TERM_ULPS + sqrt(K)) EPS32."""
    p = np.asarray(p, np.float64)
    scores = np.asarray(scores, np.float64)
    live = np.isfinite(scores)
    top = np.max(np.where(live, scores, -np.inf), axis=-1, keepdims=True)
    shift = np.where(live, np.abs(scores - top), 0.0)
    d = np.where(live, np.abs(np.broadcast_to(score_error, p.shape)) + EPS32 * shift, 0.0)
    own = (TERM_ULPS + np.sqrt(p.shape[-1])) * EPS32
    return p * (d + np.sum(p * d, axis=-1, keepdims=True) + own)


def ratio_error(num, den, num_error, den_error):
    """First-order error of num / den from the errors of num and den."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    return (np.abs(num_error) + np.abs(num / den) * np.abs(den_error)) / np.abs(den)


def two_ways(error):
    """Two computations, each within `error` of the exact value, differ by at most this."""
    return 2 * np.asarray(error, np.float64)


def score_tolerances(n, ce_original, ce_zero, ce_proxy, kl_zero, kl_proxy) -> dict:
    """Between two computations of ce_score and kl_score (proxies/_sparse_coding.py) from these
    means over n scored positions: each mean within `mean_error` of terms computed from
    log-probabilities of the size of the loss (a CE term: log-softmax of the target; a KL(p || q)
    term from log p and log q, whose p-weighted sizes are H(p) and H(p) + KL, H(p) about the
    loss), and each score's conditioning (`ratio_error`)."""
    loss = np.maximum(np.maximum(ce_original, ce_zero), ce_proxy)
    ce = {k: mean_error(n, v, loss) for k, v in
          (("o", ce_original), ("z", ce_zero), ("p", ce_proxy))}
    kl = {k: mean_error(n, v, 2 * loss + np.abs(v)) for k, v in (("z", kl_zero), ("p", kl_proxy))}
    return {"ce_score": two_ways(ratio_error(ce_zero - ce_proxy, ce_zero - ce_original,
                                             ce["z"] + ce["p"], ce["z"] + ce["o"])),
            "kl_score": two_ways(ratio_error(kl_zero - kl_proxy, kl_zero, kl["z"] + kl["p"],
                                             kl["z"]))}


def fvu_tolerance(count, sumsq, total, err, width):
    """Between two computations of fvu = err / total (dictionary_metrics.py: err =
    sum |x - x_hat|^2, total = sum |x - mean|^2 = sumsq - |sum|^2 / count over `count` tokens):
    total's rounding as dictionary_metrics.columns estimates it (the cancellation of sumsq and
    |sum|^2 / count), err's float32 sum, and the activations' rounding d (`activation_error` of
    the rms row, matmuls of `width` terms) moving err by 2 sqrt(err * count) d (Cauchy-Schwarz
    over the tokens)."""
    d = activation_error(np.sqrt(sumsq / count)[..., None], width)[..., 0]
    err_error = EPS32 * np.sqrt(count) * err + 2 * np.sqrt(err * count) * d
    total_error = EPS32 * (3 * np.sqrt(count) + 1) * sumsq
    return two_ways(ratio_error(err, total, err_error, total_error))
