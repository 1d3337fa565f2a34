"""The argument parser every `specdec` command uses."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from .errors import InputError


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as InputError, which `specdec` prints as one line with exit
    status 2, as it does any other unusable input (never argparse's usage dump).

    help_hint: end the message with "(see `PROG --help`)".
    """

    def __init__(self, *args: Any, help_hint: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help_hint = help_hint

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} (see `{self.prog} --help`)" if self.help_hint else message)
