"""A real PostgreSQL server for the tests, started from Debian's ``postgresql`` package (``.ci/run`` installs it).

Its data folder is a fresh temporary one, it listens on 127.0.0.1 on a free port with trust
authentication, and it is stopped (immediate mode) when the tests end. As root it runs as the
``postgres`` user the package creates (PostgreSQL refuses to run as root).
"""
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile


def _binary(name: str):
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self):
        self.initdb, self.pg_ctl = _binary("initdb"), _binary("pg_ctl")
        self.root = None

    @property
    def available(self) -> bool:
        if self.initdb is None or self.pg_ctl is None:
            return False
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return False
        return True

    def start(self) -> str:
        self.root = tempfile.mkdtemp(prefix="attnft-pg-")  # under /tmp: the server user can reach it
        os.chmod(self.root, 0o755)
        data = os.path.join(self.root, "data")
        os.mkdir(data, 0o700)
        if os.geteuid() == 0:
            info = pwd.getpwnam("postgres")
            os.chown(data, info.pw_uid, info.pw_gid)
            os.chown(self.root, info.pw_uid, info.pw_gid)
        subprocess.run(_as_server_user([self.initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
                       check=True, capture_output=True, timeout=120)
        self.port = free_port()
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(_as_server_user([self.pg_ctl, "-D", data, "-o", options, "-l", os.path.join(self.root, "log"),
                                        "-w", "-t", "60", "start"]), check=True, capture_output=True, timeout=90)
        self.data = data
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        if self.root is None:
            return
        subprocess.run(_as_server_user([self.pg_ctl, "-D", self.data, "-m", "immediate", "-w", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
