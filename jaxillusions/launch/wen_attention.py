"""Wen et al. section 4.1: the three architectures of the config wen_attention_variation (minimal
first layer; standard without / with linear positions), one sweep each into <workdir>/<variant>
(each resumes like `jaxillusions sweep`), then one joined table and figure in <workdir> of every
variant there (a --variants subset adds to those an earlier launch ran; the table names them):

    jaxillusions wen-attention --workdir=runs/wen_attention [--variants=minimal,standard_nope]

It validates every variant's config, and checks every variant's workdir against it, before any
work; locks the workdir, saves and exits on SIGTERM/SIGINT, and turns errors into one line
(--debug, --start_over as in `jaxillusions sweep`).
"""

import math
import os
import sys

from jaxillusions.runtime import interrupt

if __name__ == "__main__":  # first: a signal during the slow imports below is one line
    interrupt.catch_start_up()

from absl import flags  # noqa: E402

from jaxillusions.configs import wen_attention_variation  # noqa: E402
from jaxillusions.launch import common  # noqa: E402
from jaxillusions.pipeline import sweep  # noqa: E402
from jaxillusions.report import figures, tables  # noqa: E402
from jaxillusions.runtime import checkpoint, distributed  # noqa: E402
from jaxillusions.studies import wen  # noqa: E402
from jaxillusions.training import train  # noqa: E402

VARIANTS = flags.DEFINE_list("variants", list(wen_attention_variation.VARIANTS),
                             "Which architectures to run.")


def run_variants(configs: dict, workdir: str, start_over: bool) -> None:
    # Every variant's workdir against its config before any trains (sweep.run checks its own
    # only when it starts, after the variants before it have trained); and the top folder, which
    # gets the joined table, holds no run or grid of its own.
    taken = next((name for name in (checkpoint.CONFIG_FILE, *checkpoint.GRID_FILES)
                  if os.path.lexists(os.path.join(workdir, name))), None)
    if taken is not None:
        raise ValueError(f"workdir {workdir} holds another run ({taken}): the variants would "
                         "train in its subfolders and their joined table go beside its results; "
                         "use a new --workdir")
    for variant, config in configs.items():
        train.claim_workdir(os.path.join(workdir, variant), config, record=False)
    for variant, config in configs.items():
        sweep.run(config, os.path.join(workdir, variant), start_over=start_over)
    if not distributed.is_main():  # process 0 wrote the variants' files
        return
    join(workdir, list(configs))


def join(workdir: str, ran: list[str]) -> None:
    """The joined table, CSV and figure in <workdir> of every known variant whose
    <workdir>/<variant>/wen_attention.csv exists (those of this launch, `ran`, and earlier ones),
    saying which are in it: a launch with a subset of --variants adds to the table."""
    found = [v for v in wen_attention_variation.VARIANTS
             if os.path.exists(os.path.join(workdir, v, "wen_attention.csv"))]
    rows = [row for variant in found
            for row in tables.read_csv(os.path.join(workdir, variant, "wen_attention.csv"))]
    tables.write_csv(rows, os.path.join(workdir, "wen_attention.csv"), list(rows[0]))
    earlier = [v for v in found if v not in ran]
    missing = [v for v in wen_attention_variation.VARIANTS if v not in found]
    lines = [f"variants: {', '.join(found)}"
             + (f" ({', '.join(earlier)} from an earlier launch)" if earlier else "")
             + (f"; not run yet: {', '.join(missing)}" if missing else ""),
             f"{'architecture':<16} {'layer':>5} {'seeds':>5}  variation [95% jackknife interval]"
             f"  random baseline (causal)"]
    for r in rows:
        lines.append(f"{r['label']:<16} {r['layer']:>5} {r['num_seeds']:>5}  "
                     f"{r['variation']:.3f} " + (f"[{r['low']:.3f}, {r['high']:.3f}]  " if
                                                 math.isfinite(r["low"]) else "(no interval: "
                                                 "the jackknife takes 3 seeds or more)  ")
                     + f"{r['random_baseline']:.3f}")
    text = "\n".join(lines)
    with open(os.path.join(workdir, "wen_attention_table.txt"), "w") as f:
        f.write(text + "\n")
    figures.save(wen.attention_figure(rows), os.path.join(workdir, "wen_attention_variation.png"))
    print(text)


def main() -> None:
    common.parse_flags(sys.argv, __doc__, no_config=(
        "jaxillusions wen-attention takes no --config and no config overrides: it runs the "
        "variants of the config wen_attention_variation (choose them with --variants); for "
        "other settings run each with `jaxillusions sweep --config=wen_attention_variation:"
        "<variant> --config.<key>=...`"))
    if common.WORKDIR.value is None:
        sys.exit("error: --workdir is required, e.g. --workdir=runs/wen_attention")
    if not VARIANTS.value:
        sys.exit("error: --variants is empty; choose from "
                 + ",".join(wen_attention_variation.VARIANTS))
    try:
        configs = {v: wen_attention_variation.get_config(v) for v in VARIANTS.value}
    except ValueError as err:
        sys.exit(f"error: {err}")
    workdir = common.WORKDIR.value
    common.guard(lambda *settings: run_variants(dict(zip(configs, settings, strict=True)),
                                                workdir, common.START_OVER.value),
                 workdir, list(configs.values()))


if __name__ == "__main__":
    main()
