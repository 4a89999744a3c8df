"""Errors a user can fix. The CLI prints them as one line and exits 2; anything else is a bug."""


class UserError(Exception):
    """A mistake in input the user controls: a name, a file, a flag, an unreachable engine."""
