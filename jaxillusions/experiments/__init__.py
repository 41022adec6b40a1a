"""Experiments beyond the shared proxy sweep, each a stage that `sweep.run` calls when its config
section is enabled (one module each): `wen`, Wen et al.'s measurements of Dyck models."""
