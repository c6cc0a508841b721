"""Options that several commands take, each defined once."""

from __future__ import annotations

from typing import Any

import typer

DB_HELP = ("Results database: an SQLite file or a postgresql://USER@HOST/DB URL (default: $OFFLAB_DB, else "
           "/var/lib/offlab/offlab.db as root, else ~/.local/share/offlab/offlab.db).")


def db_option() -> Any:
    """`--db`, the same in every command that reads or writes results (store.default_db_path when absent)."""
    return typer.Option(None, "--db", metavar="DB", help=DB_HELP)
