"""Workdir bookkeeping: the config a workdir belongs to, and orbax checkpoints of sweep state."""

from __future__ import annotations

import json
import os
import shutil
import time

import jax
import orbax.checkpoint as ocp

from jaxillusions.logging import flatten_config

CONFIG_FILE = "config.json"


def claim_workdir(workdir: str, config, ignore: tuple[str, ...] = ()) -> None:
    """Records the config in a new workdir, or checks that an existing one holds the same config.

    Resuming with a different config would silently mix two experiments, so it is an error.
    Keys in `ignore` (e.g. logging intervals) may differ.
    """
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, CONFIG_FILE)
    new = json.loads(config.to_json())
    if not os.path.exists(path):
        with open(path + ".tmp", "w") as f:
            json.dump(new, f, indent=2, sort_keys=True)
        os.replace(path + ".tmp", path)
        return
    with open(path) as f:
        old = json.load(f)
    old_flat, new_flat = flatten_config(old), flatten_config(new)
    diffs = [k for k in sorted(set(old_flat) | set(new_flat))
             if k not in ignore and old_flat.get(k, "<missing>") != new_flat.get(k, "<missing>")]
    if diffs:
        k = diffs[0]
        raise ValueError(
            f"workdir {workdir} holds a run with a different config ({len(diffs)} keys differ, "
            f"e.g. {k}: {old_flat.get(k, '<missing>')!r} there vs {new_flat.get(k, '<missing>')!r}"
            " now); use a new --workdir or the same config")


class Checkpointer:
    """Saves the whole sweep state every N steps; restores the newest readable checkpoint."""

    def __init__(self, directory: str, max_to_keep: int = 2):
        self.directory = os.path.abspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                                                 create=True))

    def save(self, step: int, state) -> None:
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self._manager.wait_until_finished()

    def restore_latest(self, target):
        """Returns (step, state) of the newest checkpoint that restores, or (None, target).

        An unreadable checkpoint is moved aside to `<workdir>/corrupt_checkpoints/` (kept for
        inspection, never deleted) and the next older one is tried.
        """
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                state = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
                return step, state
            except Exception as err:  # noqa: BLE001 - any failure means this one is unusable
                aside = os.path.join(os.path.dirname(self.directory), "corrupt_checkpoints",
                                     f"{step}-{int(time.time())}")
                os.makedirs(os.path.dirname(aside), exist_ok=True)
                shutil.move(os.path.join(self.directory, str(step)), aside)
                print(f"WARNING: checkpoint {step} in {self.directory} is unreadable "
                      f"({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                      f"moved to {aside}, trying an older one")
                self._manager.reload()
        return None, target

    def close(self) -> None:
        self._manager.close()
