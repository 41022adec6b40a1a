"""The launchers and the `jaxillusions` command (cli.py): one subcommand per launcher.

Each launcher reads its flags (absl; --config names a shipped config or a file, common.py), turns
the config into checked Settings at the door (validate.check) and runs its job with every error
on one line. `jaxillusions sweep ...` and `python -m jaxillusions.launch.sweep ...` run the same
module.
"""
