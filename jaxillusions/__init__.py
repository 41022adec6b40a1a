"""jaxillusions: do simplified pictures of a model predict what it does out of distribution?

The package's folders are its layers, lowest first; a module imports only from its own layer or
lower ones (tests/test_architecture.py), and `python -m jaxillusions.pipeline.sweep` prints the
picture of docs/design.md from these folders' docstrings and the main job's stages. The command
`jaxillusions` (also `python -m jaxillusions`, __main__.py) is launch/cli.py.
"""

# Lowest first. config.fields (how a key is declared) is a leaf that tasks and proxies declare
# their keys with, so it sits at the bottom with runtime.
LAYERS = (
    ("runtime", "config.fields"),
    ("model",),
    ("tasks", "proxies"),
    ("config",),
    ("training", "faithfulness"),
    ("report",),
    ("studies",),
    ("pipeline",),
    # The shipped configs (ml-collections files, read at the pipeline's door) and, above them,
    # the launchers and the `jaxillusions` command: the only folders that name ml_collections.
    ("configs",),
    ("launch",),
)
