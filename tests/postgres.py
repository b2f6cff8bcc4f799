"""A throwaway PostgreSQL server for the tests: initdb into a fresh folder, started on a free loopback port, stopped and
removed at the end. PostgreSQL refuses to run as root, so under root its folder is given to the `postgres` user
(Debian's package makes it) and its programs run as that user. `.ci/run` (scripts/test.sh) installs PostgreSQL
where it is missing; a run outside CI without it skips these tests, CI fails them."""

import glob
import os
import pwd
import shutil
import subprocess
import tempfile

import pytest

from conftest import free_port


def pg_program(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


class Postgres:
    def __init__(self):
        initdb, self.pg_ctl = pg_program("initdb"), pg_program("pg_ctl")
        if not initdb or not self.pg_ctl:
            if os.environ.get("CI"):
                raise AssertionError("PostgreSQL is not installed (scripts/test.sh installs Debian's postgresql)")
            pytest.skip("PostgreSQL is not installed here (scripts/test.sh installs it)")
        self.folder = tempfile.mkdtemp(prefix="qa-amp-pg-")  # under /tmp: another user can reach it
        self.as_user = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.data, self.port = os.path.join(self.folder, "data"), free_port()
        self.run(initdb, "-D", self.data, "-U", "qa", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.run(self.pg_ctl, "-D", self.data, "-l", os.path.join(self.folder, "log"), "-w", "-t", "60", "-o",
                 f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        self.url = f"postgresql+psycopg://qa@127.0.0.1:{self.port}/postgres"

    def run(self, *cmd):
        proc = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, cwd=self.folder)
        assert proc.returncode == 0, f"{cmd[0]}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"

    def database(self, name: str) -> str:
        """A new empty database of this server: its URL."""
        import sqlalchemy as sa

        engine = sa.create_engine(self.url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        return self.url.rsplit("/", 1)[0] + "/" + name

    def stop(self):
        self.run(self.pg_ctl, "-D", self.data, "-m", "fast", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)
