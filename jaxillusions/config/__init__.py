"""Settings: every key as typed, frozen dataclasses (settings.py), declared with
fields.py."""
