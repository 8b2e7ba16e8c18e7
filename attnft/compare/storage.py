"""The study's database: opened and checked before anything is written into it (:func:`open_storage`), and a full
disk under it told apart from the database's other errors (:func:`database_full`).

A database writes a transaction whole or not at all, so a full disk leaves the studies as they were before the write
that failed: freeing some space and running the comparison again resumes it.
"""
from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Optional

from ..core.errors import AttnftError, ConfigError, DiskFullError
from ..core.files import FULL_DISK, FULL_DISK_REASONS, remove_entry
from .urls import masked, safe_url

SCHEMA_ATTEMPTS = 5
# a running trial records a heartbeat this often; one silent for the grace period (its process or machine gone) is
# failed by the next process that looks, so that it neither counts toward N nor holds up the report
HEARTBEAT_S, GRACE_S = 60, 600
# what a database says when the disk under it is full: SQLite's words, else the OS's (PostgreSQL: "could not extend
# file ...: No space left on device")
_FULL = ("database or disk is full", *FULL_DISK_REASONS)


def require_optuna():
    try:
        import optuna
    except ImportError:
        raise ConfigError("attnft compare --search needs Optuna: pip install 'attnft[compare]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_storage(url: str):
    """Optuna's RDBStorage for ``url``; a ConfigError line if the database cannot be reached or read, a DiskFullError
    if the disk under it is full (an SQLite file made here is then removed: half a schema reads as another program's
    tables)."""
    optuna = require_optuna()
    made = _sqlite_file(url)
    made = made if made is not None and not os.path.lexists(made) else None
    try:
        engine_kwargs = {"connect_args": {"connect_timeout": 10}} if url.startswith(("postgresql", "mysql")) else {}
        _check_no_foreign_tables(url, engine_kwargs)
        return _rdb_storage(optuna, url, engine_kwargs)
    except DiskFullError:
        if made is not None:
            for leftover in (made, made.with_name(made.name + "-journal")):
                remove_entry(leftover)
        raise


def _rdb_storage(optuna, url: str, engine_kwargs: dict):
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError

    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            with warnings.catch_warnings():  # the heartbeat is "experimental" in Optuna since 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S,
                                                  grace_period=GRACE_S)
        except (IntegrityError, ProgrammingError, OperationalError) as e:
            # workers started together on an empty database race to create Optuna's tables: the loser finds them
            denied = "permission denied" in str(e).lower() or "insufficientprivilege" in str(e).lower()
            racing = not denied and (not isinstance(e, OperationalError) or "already exists" in str(e))
            if not racing or attempt == SCHEMA_ATTEMPTS - 1:
                if not racing:
                    raise _unusable(e, url) from None
                raise
            time.sleep(0.5 * (attempt + 1))
        except (SQLAlchemyError, ValueError, ImportError, OSError) as e:
            raise _unusable(e, url) from None


_OPTUNA_TABLES = {"studies", "trials", "version_info"}  # a database Optuna made holds these (and more)


def _check_no_foreign_tables(url: str, engine_kwargs: dict) -> None:
    """ConfigError, before Optuna writes its schema, if the database holds tables but not Optuna's: another
    program's database (an SQLite file of an app, say) gets no study tables added."""
    import sqlalchemy
    from sqlalchemy.exc import SQLAlchemyError

    try:
        engine = sqlalchemy.create_engine(url, **engine_kwargs)
        try:
            tables = set(sqlalchemy.inspect(engine).get_table_names())
        finally:
            engine.dispose()
    except (SQLAlchemyError, ValueError, ImportError, OSError) as e:
        raise _unusable(e, url) from None
    if tables and not _OPTUNA_TABLES <= tables:
        shown = ", ".join(sorted(tables)[:3]) + (" ..." if len(tables) > 3 else "")
        raise ConfigError(f"the study database {safe_url(url)} holds another program's tables ({shown}) and no "
                          "Optuna study: pass an empty database or one of Optuna's")


def _unusable(error: Exception, url: str) -> AttnftError:
    """The one line of a database that cannot be used: its disk full, or the database's reason."""
    if database_full(error) or isinstance(error, OSError) and error.errno in FULL_DISK:
        return full_database(url)
    return ConfigError(f"cannot use the study database {safe_url(url)}: {_reason(error, url)}")


def _reason(error: Exception, url: str) -> str:
    """The database's error in one line, ``url``'s password masked (a URL it cannot parse is quoted whole)."""
    return masked(" ".join(str(getattr(error, "orig", None) or error).split()), url)[:200]


def database_full(error: BaseException) -> bool:
    """Whether ``error`` is the database's (Optuna's StorageInternalError, SQLAlchemy's, its driver's), it or the error
    it was raised from (``raise ... from``) saying that the disk under the database is full."""
    try:
        import sqlalchemy.exc
        from optuna.exceptions import StorageInternalError
    except ImportError:  # a comparison without a search, Optuna not installed: no database
        return False
    if not isinstance(error, (StorageInternalError, sqlalchemy.exc.SQLAlchemyError)):
        return False
    while error is not None:
        if any(words in str(getattr(error, "orig", None) or error).lower() for words in _FULL):
            return True
        error = error.__cause__
    return False


def full_database(url: str) -> DiskFullError:
    """The one line of a study database whose disk is full."""
    return DiskFullError(f"no space left on device writing the study database {safe_url(url)}")


def _sqlite_file(url: str) -> Optional[Path]:
    """The file of an SQLite URL (None: another database, or SQLite in memory)."""
    if not url.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url

    try:
        database = make_url(url).database
    except Exception:  # a URL SQLAlchemy cannot read: open_storage says so
        return None
    return Path(database) if database and database != ":memory:" else None
