"""The attempt lock's refusals in one process: a lock file that is a link out of the run directory, and a filesystem
without locks (Lustre mounted without `flock`), for which a fake `lockf` fails as such a filesystem does (this machine
cannot mount one). The real lock between real processes is tests/e2e/test_attempt_lock.py."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from legato.dist.peers import Peers
from legato.errors import UsageError
from legato.session import attempt_lock
from legato.session.attempt_lock import AttemptLock


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS])
def test_a_filesystem_without_locks_lets_the_launch_go_on_with_a_warning(tmp_path: Path, monkeypatch, caplog, code: int) -> None:
    def refused(fd: int, how: int) -> None:
        raise OSError(code, "no locks here")

    monkeypatch.setattr(attempt_lock.fcntl, "lockf", refused)
    with caplog.at_level(logging.WARNING, logger="legato.session.attempt_lock"):
        lock = AttemptLock.claim(tmp_path, Peers(0, 1, None), wait_s=5)
    assert "a second launch into this run directory would not be refused" in caplog.text
    assert (tmp_path / "attempt.lock").read_text() == ""
    lock.release()


def test_a_lock_file_that_is_a_link_out_of_the_run_directory_is_refused_untouched(tmp_path: Path) -> None:
    run_dir, outside = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    outside.write_text("theirs\n")
    (run_dir / "attempt.lock").symlink_to(outside)
    with pytest.raises(UsageError, match="attempt.lock is a symbolic link"):
        AttemptLock.claim(run_dir, Peers(0, 1, None), wait_s=5)
    assert outside.read_text() == "theirs\n"
