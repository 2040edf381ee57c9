"""Errors the user can fix: the CLI prints them as one message and exits 2, no traceback."""


class UserError(Exception):
    """Bad input or an impossible request; the message says what and where."""


class ManifestError(UserError):
    """A manifest that does not validate: the message names the file, the field and what was expected."""
