"""`python -m jaxillusions`: the `jaxillusions` command (jaxillusions/launch/cli.py)."""

from jaxillusions.launch import cli

if __name__ == "__main__":
    cli.main()
