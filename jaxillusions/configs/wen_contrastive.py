"""Wen et al. section 4.2 on the same engine: does contrastive regularization (eq. 22) towards
the balance condition improve length generalization? Dyck-(2, 4), a minimal first layer (eq. 19),
32 seeds under every weight lambda in {0, 0.3, 1} (members = weights x seeds, trained together;
the same seeds under every weight, so comparisons are paired):

    jaxillusions sweep --config=wen_contrastive --workdir=runs/wen_contrastive

Writes wen_results.csv (one row per (seed, weight): length generalization up to 16x the training
length, balance violation, accuracies), wen_summary.txt (per-weight means, paired differences vs
lambda=0, Spearman correlation of balance violation and length generalization across seeds),
figures/wen_*.png and TensorBoard. Time: 4 min 37 s alone on the 2-core CPU machine (AMD EPYC of
family 25 model 17), 3 min 25 s on the AMD EPYC of family 26 model 2 (the same numbers).
Result (docs/wen.md): lambda=0.3 raises length generalization from 0.856 to 0.900 (paired
+0.045 ± 0.010 over 32 seeds); the balance violation's median does not change, and it does not
correlate with length generalization. On the Intel Xeon of family 6 model 207 (7 min 0 s,
`time 418 s: training 409 s, wen 9 s`): the gain +0.053 ± 0.012 (0.845 to 0.898), the same
verdicts.
"""

from ml_collections import ConfigDict

from jaxillusions.configs import wen_attention_variation


def get_config() -> ConfigDict:
    config = wen_attention_variation.get_config("minimal")
    config.wen.label = "contrastive"

    # The swept weight: members = weights x seeds.
    config.train.contrastive_weights = (0.0, 0.3, 1.0)
    config.train.batch_size = 16  # 96 members, each with a second (prefixed) forward pass
    return config
