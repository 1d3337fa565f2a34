"""Errors that the command line turns into one clear line instead of a traceback."""


class InputError(Exception):
    """Unusable input (missing directory, malformed file, bad flag value).

    The message names the file or field and says how to fix it; the CLI prints it on one line and
    exits with status 2.
    """
