"""Does interpretation predict behaviour? The held-out prediction test on a Dyck population of
270 trained members (3 learning rates x 3 weight decays x 30 seeds) and their 270 untrained
copies, in one program (docs/prediction.md, "Findings").

    jaxillusions sweep --config=dyck_predict --workdir=runs/dyck_predict

On the 2-core CPU machine (AMD EPYC, `lscpu`: AuthenticAMD family 25 model 17; alone, data
cached) the job took 40 min 49 s wall, its line `time 2445 s: training 1611 s, collection 226 s,
fitting 14 s, evaluation 151 s, probes 284 s, reports 13 s, figures 89 s, prediction 54 s` (the
untrained copies cost no training). A second run, after training's packed batches and gradient
rules, on the AMD EPYC of family 26 model 2: 12 min 36 s, `time 753 s: training 438 s,
collection 91 s, fitting 11 s, evaluation 74 s, proxies 3 s, probes 74 s, reports 10 s, figures
35 s, prediction 18 s` (its members differ in the last bits; which verdicts it kept:
docs/prediction.md, "The same study on a second population"). A third, with today's code on
the AMD EPYC of family 25 model 17 (alone, data cached): 16 min 10 s, `time 969 s: training 622
s, ..., prediction 24 s`; it keeps the same conclusions. A fourth, the same code on the Intel
Xeon of family 6 model 207 (alone, data cached): 22 min 49 s, `time 1367 s: training 895 s, ...,
prediction 37 s`, peak memory 2.6 GB; the same conclusions, two verdicts near their threshold
moved (docs/prediction.md, "The same study on a second population"); its proxies and
probes refitted on those members with the collection in chunks of 64 rows (dyck_small.py):
collection 64 s against 125 s, probes 60 s against 99 s, prediction.txt byte-identical. What
the first run showed (prediction.txt; docs/prediction.md, "Findings on a Dyck population"),
AUROC of each member's OOD accuracy above the median, 270 members: under random splits the
interpretation features (0.906 on unseen_depth, 0.898 on longer) do not beat the
hyper-parameters alone (0.946, 0.907; differences within noise); with one of the 9 settings held
out they rank the unseen setting's members (0.789, 0.777) where the hyper-parameters cannot
(0.5), beating them on longer (+0.277 [+0.015, +0.538]) and within noise on unseen_depth; the
same features of the untrained copies predict at chance (0.41, 0.48). The proxies' faithfulness
predicts their own OOD gaps with a setting held out (SVD rank 2 on unseen_depth: 0.845, +0.345
[+0.162, +0.529] over the hyper-parameters).
"""

from ml_collections import ConfigDict

from jaxillusions.configs import dyck_small


def get_config() -> ConfigDict:
    # The demo's data (Dyck-(8, 6), 300 sentences per evaluation split), model (2 layers, 1
    # head, d_model 32), 2500 steps and 2 CPU devices.
    config = dyck_small.get_config()

    # The members: every (learning rate, weight decay) setting x 30 seeds, trained together,
    # and the same 270 members untrained (the null population: their initial parameters,
    # which cost no training).
    config.train.num_seeds = 30
    config.train.learning_rates = (1e-3, 3e-3, 1e-2)
    config.train.weight_decays = (0.0, 0.1, 1.0)
    config.train.null = ("untrained",)
    config.train.eval_every = 2500  # evaluated once, at the end

    # The interpretations: the SVD and k-means of the last layer's queries at three and two
    # sizes (features: their faithfulness in distribution; targets: their OOD gap at the
    # smallest size), each head's attention on the open bracket that the next token closes
    # (the Dyck task's attention target), and a linear probe of the stack depth after the
    # first layer.
    config.proxies.methods = ("svd", "kmeans")
    config.proxies.targets = ("blocks.-1.attn.q",)
    config.proxies.svd_ranks = (2, 4, 8)
    config.proxies.kmeans_sizes = (4, 16)
    config.proxies.eval_splits = ("iid", "unseen_depth", "longer")
    config.proxies.concepts = ("depth",)
    config.probes.sites = ("blocks.0.resid_post",)

    # The test: targets binarised at the trained population's median, 5-fold x 10 random
    # splits and leave one of the 9 settings out.
    config.prediction.enabled = True
    return config
