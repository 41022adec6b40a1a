"""Wen et al. section 4.1: the three architectures of configs/wen_attention_variation.py (minimal
first layer; standard without / with linear positions), one sweep each into <workdir>/<variant>
(each resumes like launch.sweep), then one joined table and figure in <workdir>:

    python -m launch.wen_attention --workdir=runs/wen_attention [--variants=minimal,standard_nope]
"""

import os
import sys

from absl import app, flags

from configs import wen_attention_variation
from jaxillusions import sweep, wen
from jaxillusions.analysis import figures

WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the joined results.")
VARIANTS = flags.DEFINE_list("variants", list(wen_attention_variation.VARIANTS),
                             "Which architectures to run.")


def main(_) -> None:
    if WORKDIR.value is None:
        sys.exit("error: --workdir is required, e.g. --workdir=runs/wen_attention")
    try:
        tables = []
        for variant in VARIANTS.value:
            config = wen_attention_variation.get_config(variant)
            sweep.run(config, os.path.join(WORKDIR.value, variant))
            tables += wen.read_csv(os.path.join(WORKDIR.value, variant, "wen_attention.csv"))
    except ValueError as err:
        sys.exit(f"error: {err}")
    wen.write_csv(tables, os.path.join(WORKDIR.value, "wen_attention.csv"))
    lines = [f"{'architecture':<16} {'layer':>5} {'seeds':>5}  variation [95% jackknife interval]"
             f"  random baseline (causal)"]
    for r in tables:
        lines.append(f"{r['label']:<16} {r['layer']:>5} {r['num_seeds']:>5}  "
                     f"{r['variation']:.3f} [{r['low']:.3f}, {r['high']:.3f}]  "
                     f"{r['random_baseline']:.3f}")
    text = "\n".join(lines)
    with open(os.path.join(WORKDIR.value, "wen_attention_table.txt"), "w") as f:
        f.write(text + "\n")
    figures.save(wen.attention_figure(tables),
                 os.path.join(WORKDIR.value, "wen_attention_variation.png"))
    print(text)


if __name__ == "__main__":
    app.run(main)
