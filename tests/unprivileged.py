"""Permission tests that run as root too (CI runs as root, which writes anywhere).

``as_a_user()`` sets root's privileges aside for a block: real and effective ids become
nobody's (supplementary groups dropped), the saved uid stays 0 so they come back at the
end, so the kernel checks permissions, ``os.access`` included, as it does for a user.
``users_dir()`` is a directory that user owns and can reach (pytest's temporary
directories are root's alone). Run as any other user, both leave things as they are.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT_UID = 0


def _nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


@contextlib.contextmanager
def users_dir(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path`` as a user; as root, a new directory nobody owns, in a directory that
    nobody can reach, removed at the end."""
    if os.geteuid() != ROOT_UID:
        yield tmp_path
        return
    uid, gid = _nobody()
    base = Path(tempfile.mkdtemp(prefix="redrive-as-a-user-"))
    try:
        base.chmod(0o711)
        mine = base / "home"
        mine.mkdir()
        os.chown(mine, uid, gid)
        yield mine
    finally:
        shutil.rmtree(base, ignore_errors=True)


def chown_to_the_user(path: Path) -> None:
    """Give ``path`` to the user ``as_a_user`` becomes (nothing to do when not root)."""
    if os.geteuid() == ROOT_UID:
        uid, gid = _nobody()
        os.chown(path, uid, gid)


@contextlib.contextmanager
def as_a_user() -> Iterator[None]:
    """The block runs as nobody when this process is root (see the module's docstring)."""
    if os.geteuid() != ROOT_UID:
        yield
        return
    uid, gid = _nobody()
    groups = os.getgroups()
    os.setgroups([])
    os.setresgid(gid, gid, 0)
    os.setresuid(uid, uid, ROOT_UID)
    try:
        yield
    finally:
        os.setresuid(ROOT_UID, ROOT_UID, ROOT_UID)
        os.setresgid(0, 0, 0)
        os.setgroups(groups)
