"""A real full disk: a small tmpfs (as root; else the test is skipped) and a file that fills it."""
import os
import shutil
import subprocess

import pytest


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MB tmpfs (as root; else skipped): a real full disk."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(folder, leave_bytes: int) -> None:
    """Fill the file system of ``folder`` until about ``leave_bytes`` are free (``folder/filler``; unlink it to free)."""
    free = shutil.disk_usage(folder).free
    with open(os.path.join(folder, "filler"), "ab") as f:
        f.write(b"\0" * max(0, free - leave_bytes))
