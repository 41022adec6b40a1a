"""A finished workdir as data: `load_results` (results.csv as a typed pandas DataFrame) and
`load_run` (trained parameters with their configs and data, from the checkpoint).

pandas is imported only when called (importing the package stays light).

DataFrame columns (one row per seed, site, method, size, split, breakdown, bin):

    seed       int64
    site       string, e.g. "blocks.1.attn.k" or "blocks.1.attn.q+blocks.1.attn.k"; "" for the
               original model
    method     category: "original" (the trained model itself), "svd", "kmeans", ...
    size       int64 rank / number of clusters; NO_SIZE (0) for the original model and the
               data-independent proxies (onehot_attention, uniform_attention)
    split      ordered category, in evaluation order (config.proxies.eval_splits)
    breakdown  category: "all", "depth", "distance", "position" (those the rows have)
    bin        int64 depth / distance / position; ALL_BINS (-1) on breakdown == "all" rows
    n          int64 closing-bracket positions in the bin (per seed)
    acc        float64 closing-bracket accuracy of this row's model (the proxy, or the original)
    jsd, same_pred, ...   float64 faithfulness to the original (NaN on the original's rows)
    <hyper-parameter>     float64, or for `null` a category (trained, untrained, shuffled): a
               column per hyper-parameter that varies between a run's groups of members
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxillusions.report import tables
from jaxillusions.runtime import schema
from jaxillusions.runtime.schema import ALL_BINS, NO_SIZE, ORIGINAL

if TYPE_CHECKING:
    import pandas as pd



# ---------------------------------------------------------------------------------------------
# results.csv <-> the in-memory rows of faithfulness.evaluate. In memory every proxy row carries
# acc_original and acc_proxy; in the CSV each row has `acc` (its own model's accuracy) and the
# original model has rows of its own, one per (seed, split, breakdown, bin).


def csv_rows(rows: Iterable[dict]) -> list[dict]:
    """In-memory rows -> CSV rows: the original model's rows first, then the proxies' rows."""
    out, originals = [], {}
    for row in rows:
        row = dict(row)
        acc_original = row.pop("acc_original")
        row[schema.ACC] = row.pop("acc_proxy")
        out.append(row)
        key = (row["seed"], row["split"], row["breakdown"], row["bin"])
        if key not in originals:  # every proxy sees the same positions and parameters
            originals[key] = {"seed": row["seed"], "site": "", "method": ORIGINAL,
                              "size": NO_SIZE, "split": row["split"],
                              "breakdown": row["breakdown"], "bin": row["bin"], "n": row["n"],
                              "acc": acc_original}
    return list(originals.values()) + out


def from_csv_rows(table: Iterable[dict]) -> list[dict]:
    """CSV rows -> in-memory rows (acc_original and acc_proxy on every proxy row)."""
    table = list(table)
    originals = {(r["seed"], r["split"], r["breakdown"], r["bin"]): r["acc"]
                 for r in table if r["method"] == ORIGINAL}
    rows = []
    for row in table:
        if row["method"] != ORIGINAL:
            row = dict(row)
            row["acc_original"] = originals[(row["seed"], row["split"], row["breakdown"],
                                             row["bin"])]
            row["acc_proxy"] = row.pop("acc")
            rows.append(row)
    return rows


def write_csv(rows: Iterable[dict], path: str) -> None:
    """Writes in-memory rows as results.csv, atomically (a temp file, then rename). NaN is an
    empty cell."""
    table = csv_rows(rows)
    extra = tuple(k for k in dict.fromkeys(itertools.chain.from_iterable(table))
                  if k not in schema.CSV)  # each row's keys, in order of first appearance
    tables.write_csv(table, path, schema.CSV + extra)


def read_csv(path: str) -> list[dict]:
    """results.csv -> in-memory rows (numbers as numbers, empty cells NaN, `bin` an int or "" on
    `all` rows, as in memory). For analysis, prefer `load_results`, a typed DataFrame."""
    table = tables.read_csv(path)
    if table and "acc" not in table[0]:
        raise ValueError(f"{path}: no `acc` column; written by an older version? "
                         "load_results reads both layouts")
    return from_csv_rows(table)


def load_results(workdir: str, splits: Sequence[str] | None = None) -> pd.DataFrame:
    """results.csv of a workdir as a typed DataFrame (see the module docstring for columns).

    A run whose members differ in a hyper-parameter (train.null, train.contrastive_weights, ...)
    has a results.csv per group (`<workdir>/null_1/`, ...): all of them are read, with a column
    per hyper-parameter that varies (float64; `null` a category of the member kinds: trained,
    untrained, shuffled). `workdir` may also be one results.csv path. `splits` fixes the order
    of the `split` category; by default config.proxies.eval_splits of the workdir (or its
    parent), else the order in which splits first appear in the files. A path that is not there,
    a run without results yet, or a file that is not a results.csv: a one-line error naming it.
    """
    import pandas as pd

    if not os.path.exists(workdir):
        raise FileNotFoundError(f"{workdir} not found: give a jaxillusions workdir or the path "
                                "of its results.csv")
    config, own = _stored_config(os.path.abspath(workdir if os.path.isdir(workdir)
                                                 else os.path.dirname(workdir)))
    parts = (_group_tables(config, workdir) if os.path.isdir(workdir) and own
             else [(os.path.join(workdir, "results.csv") if os.path.isdir(workdir) else workdir,
                    {})])
    frames = []
    for path, varying in parts:
        where = os.path.dirname(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{where} has no results yet (no results.csv: its sweep has not finished "
                "evaluating the proxies); run or relaunch jaxillusions sweep on it first"
                if config is not None else f"{path} not found: is {where} a jaxillusions workdir?")
        try:
            df = pd.read_csv(path, dtype={"site": str, "method": str, "split": str,
                                          "breakdown": str, "bin": str},
                             keep_default_na=False, na_values={}, low_memory=False)
        except ValueError as err:  # pandas' ParserError and EmptyDataError, or not text
            said = str(err).strip().split("\n")[0]
            raise ValueError(f"{path} is not a results.csv (not a CSV table: {said})") from None
        missing = [k for k in schema.KEYS if k not in df]
        if missing:
            raise ValueError(f"{path} is not a results.csv (no columns {missing}): give a "
                             "jaxillusions workdir or the path of its results.csv")
        if "acc_proxy" in df:  # a table written before the original model had rows of its own
            df = _with_original_rows(df)
        frames.append((path, df, varying))
    df = pd.concat([f for _, f, _ in frames], ignore_index=True)
    if splits is None:
        splits = (list(config.proxies.eval_splits) if config is not None
                  else list(dict.fromkeys(df["split"])))
    unknown = sorted(set(df["split"]) - set(splits))
    if unknown:
        raise ValueError(f"{', '.join(p for p, _, _ in frames)}: splits {unknown} are not in the "
                         f"given order {list(splits)}")
    keys = set(schema.KEYS)
    out = pd.DataFrame({
        "seed": df["seed"].astype("int64"),
        "site": df["site"].astype("string"),
        "method": pd.Categorical(df["method"], categories=_method_order(df["method"])),
        "size": df["size"].astype("int64"),
        "split": pd.Categorical(df["split"], categories=list(splits), ordered=True),
        "breakdown": pd.Categorical(df["breakdown"],
                                    categories=list(dict.fromkeys(df["breakdown"]))),
        "bin": df["bin"].replace("", str(ALL_BINS)).astype("int64"),
        "n": df["n"].astype("int64"),
    })
    for col in [c for c in df.columns if c not in keys]:
        try:  # a metric, or a grid's key; a grid's `null` holds the member kinds
            out[col] = pd.to_numeric(df[col].replace("", np.nan), errors="raise").astype("float64")
        except ValueError:
            out[col] = pd.Categorical(df[col], categories=list(dict.fromkeys(df[col])))
    for name in dict.fromkeys(k for _, _, v in frames for k in v):
        values = np.concatenate([np.repeat(v[name], len(f)) for _, f, v in frames])
        out[name] = (pd.Categorical(values, categories=list(dict.fromkeys(values)))
                     if isinstance(values[0], str) else values.astype("float64"))
    return out


def _stored_config(directory: str) -> tuple[object, bool]:
    """(the stored config of the run in `directory`, or of the run whose group it is: its parent;
    None where neither has one, whether it is `directory`'s own)."""
    from jaxillusions.config import settings

    for where in (directory, os.path.dirname(directory)):
        try:
            return settings.read_stored(where), where == directory
        except (FileNotFoundError, AttributeError, KeyError):
            continue
    return None, False


def _group_tables(config, workdir: str) -> list[tuple[str, dict]]:
    """(results.csv, the hyper-parameters that vary at its members) of each group of the
    members of the run in `workdir` (train.member_groups): its own when there is one group."""
    from jaxillusions.training import train

    groups = train.member_groups(config, workdir)
    if len(groups) == 1:
        return [(os.path.join(workdir, "results.csv"), {})]
    members = train.members(config)
    return [(os.path.join(d, "results.csv"), members.varying(idx[0])) for idx, d in groups]


def _method_order(methods) -> list[str]:
    names = list(dict.fromkeys(methods))
    return ([ORIGINAL] if ORIGINAL in names else []) + [m for m in names if m != ORIGINAL]


def _with_original_rows(df: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    keys = ["seed", "split", "breakdown", "bin"]
    original = df.drop_duplicates(keys)[keys + ["n", "acc_original"]].rename(
        columns={"acc_original": "acc"})
    original = original.assign(site="", method=ORIGINAL, size=NO_SIZE)
    proxies = df.drop(columns=["acc_original"]).rename(columns={"acc_proxy": "acc"})
    return pd.concat([original, proxies], ignore_index=True)[
        list(schema.CSV) + [c for c in proxies.columns if c not in schema.CSV]]


@dataclasses.dataclass
class Run:
    """A trained sweep: every leaf of `params` has a leading member axis, in the order of
    `labels`. Members are the seeds, or (hyper-parameter, seed) pairs when the config sweeps a
    training hyper-parameter (train.contrastive_weights), labelled "<seed>_cw<weight>"."""

    params: dict
    config: Any  # settings.Settings: what the workdir was trained with
    model_config: Any  # jaxillusions.model.ModelConfig
    splits: dict  # name -> the task's split (regenerated or cached, deterministic)
    seeds: list[int]  # [M] the seed of each member
    labels: list  # [M] run labels: the seed, or "<seed>_cw<weight>"
    healthy: np.ndarray  # [M] bool: False for members that diverged in training
    step: int  # the training step of the checkpoint
    member_hparams: dict = dataclasses.field(default_factory=dict)  # name -> [M] values

    def index(self, member: int | str) -> int:
        """Position of a member on the leading axis, by label, or by seed number if unique."""
        if member in self.labels:
            return self.labels.index(member)
        hits = [i for i, s in enumerate(self.seeds) if s == member]
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise ValueError(f"seed {member!r} has {len(hits)} members; pick one of the labels "
                             f"{[self.labels[i] for i in hits]}")
        raise ValueError(f"seed {member!r} is not in this run; it has seeds "
                         f"{sorted(set(self.seeds))} (labels {self.labels})")

    def seed_params(self, member: int | str) -> dict:
        """One member's parameters (no leading axis), by seed number or label."""
        import jax

        i = self.index(member)
        return jax.tree.map(lambda x: x[i], self.params)


def load_run(workdir: str, *, verbose: bool = False) -> Run:
    """The newest checkpoint of a workdir with its config, model config, data splits and seeds
    (imported members, model.pretrained: their checkpoint directories, step 0)."""
    import jax

    from jaxillusions import tasks
    from jaxillusions.config import settings
    from jaxillusions.runtime import checkpoint as ckpt_lib
    from jaxillusions.training import imported, train
    from jaxillusions.training import step as step_lib

    config = settings.read_stored(workdir)
    splits, model_cfg, tx = train.build(config, tasks.get(config).load(config.data,
                                                                      verbose=verbose))
    train.check_data(workdir, splits)  # the data its members were measured on
    members = train.members(config)
    if config.model.pretrained:  # imported: read from their directories again, at step 0
        params, healthy = imported.load_params(config, workdir)
        state, step = step_lib.SweepState(params, (), None, None, healthy), 0
    else:
        # The checkpoint's tree has the shapes of a fresh state (no compute: eval_shape).
        target = jax.eval_shape(lambda: step_lib.init_state(members.seeds, model_cfg, tx))
        checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, ckpt_lib.CHECKPOINT_DIR))
        try:
            step, state = checkpointer.restore_latest(target)
        finally:
            checkpointer.close()
    if step is None:
        raise FileNotFoundError(f"{workdir}/checkpoints has no readable checkpoint")
    if verbose:
        print(f"loaded {workdir} at step {step}: {len(members.labels)} members")
    return Run(params=state.params, config=config, model_config=model_cfg, splits=splits,
               seeds=[int(s) for s in members.seeds], labels=list(members.labels),
               healthy=np.asarray(state.healthy), step=int(step),
               member_hparams={k: np.asarray(v) for k, v in members.hparams.items()})
