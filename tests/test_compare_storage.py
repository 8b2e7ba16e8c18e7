"""The study database of ``attnft compare``: another program's database, a PostgreSQL user who may not create
tables, a study name the database cannot hold — each one line, exit 2, nothing written (victims hashed)."""
import hashlib
import sqlite3

import pytest

from test_compare import compare_argv, fashion_folder
from test_runner import _fails_cleanly

pytest.importorskip("optuna")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return fashion_folder(tmp_path_factory.mktemp("data") / "clothes", train=10, test=5)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_sqlite_file_of_another_program_is_refused_and_left_as_it_was(capsys, data, tmp_path):
    other = tmp_path / "app.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO users (name) VALUES ('bob')")
    before = _digest(other)
    argv = compare_argv(data, tmp_path / "out", tmp_path / "store", "--storage", f"sqlite:///{other}", search="1")
    _fails_cleanly(capsys, argv, words=["another program's tables (users)"], untouched=[tmp_path])
    assert _digest(other) == before and not (tmp_path / "out").exists()


def test_a_postgresql_user_who_may_not_create_tables_is_one_line(capsys, data, tmp_path, postgres_url):
    import psycopg

    with psycopg.connect(postgres_url.replace("postgresql://", "postgresql://", 1), autocommit=True) as db:
        db.execute("DROP DATABASE IF EXISTS readonly_db")
        db.execute("DROP ROLE IF EXISTS reader")
        db.execute("CREATE ROLE reader LOGIN")
        db.execute("CREATE DATABASE readonly_db")
    url = postgres_url.replace("postgres@", "reader@").rsplit("/", 1)[0] + "/readonly_db"
    argv = compare_argv(data, tmp_path / "out", tmp_path / "store", "--storage", url, search="1")
    _fails_cleanly(capsys, argv, words=["cannot use the study database", "permission denied"], untouched=[tmp_path])
    assert not (tmp_path / "out").exists()


def test_a_study_name_longer_than_the_database_holds_is_refused_before_anything_is_written(capsys, data, tmp_path):
    argv = compare_argv(data, tmp_path / "out", tmp_path / "store", "--study", "s" * 600, search="1")
    _fails_cleanly(capsys, argv, words=["makes study names of", "at most 512"], untouched=[tmp_path])
    assert not (tmp_path / "out").exists()
