"""CLI sub-commands: each module here exposes `register(app)`; cli.py discovers them."""
