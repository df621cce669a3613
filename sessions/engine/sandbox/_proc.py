"""Process-group and work-directory chores shared by the backend, the watchdog and the reaper.

Standard library only, read straight from ``/proc``: the watchdog imports this module and must
start fast and depend on nothing that might be missing or broken in the worker's environment.
Linux only, like the sandboxes themselves.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

MARKER = ".pandaweb-sandbox"
REMOVE_PASSES = 5
REMOVE_PAUSE_SECONDS = 0.1
DEADLINE_FILE = "deadline"
PGID_FILE = "pgid"
RECORD_FILE = "sandbox.json"

_PROC = Path("/proc")

_ExcInfo = tuple[type[BaseException], BaseException, object]


def atomic_write(path: Path, text: str) -> None:
    """Write so that a concurrent reader sees the old content or the new, never a torn mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_deadline(workdir: Path) -> float | None:
    """The current deadline, or None when the file is gone (the sandbox is being removed)."""
    try:
        text = (workdir / DEADLINE_FILE).read_text()
    except FileNotFoundError:
        return None
    try:
        return float(text)
    except ValueError:
        # Unreadable means nobody can vouch for the sandbox any more: treat it as expired.
        return 0.0


def read_pgid(workdir: Path) -> tuple[int, int] | None:
    """(pgid, leader pid) as recorded right after the browser was spawned."""
    try:
        pgid, leader = (workdir / PGID_FILE).read_text().split()
        return int(pgid), int(leader)
    except (FileNotFoundError, ValueError):
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a process, or None if it is gone."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name sits in parentheses and may itself contain spaces or ')'.
    rest = raw.rpartition(")")[2].split()
    return rest[0], int(rest[2])


def _live(state: str) -> bool:
    # Zombies (Z) and the dead (X) are only entries waiting for their parent to reap them; they
    # run nothing. On hosts whose PID 1 does not reap, they linger indefinitely.
    return state not in {"Z", "X"}


def _cmdline(pid: int) -> list[str]:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def mentions(args: Iterable[str], workdir: str) -> bool:
    """Whether a command line refers to ``workdir`` (as a path or a path inside it).

    Chromium's zygote and its children rewrite their title into a single space-joined argument,
    so the path is searched for in the joined line, with boundaries: a plain substring test would
    confuse ``.../run1`` with ``.../run10``.
    """
    line = " ".join(args)
    target = workdir.rstrip("/")
    start = line.find(target)
    while start != -1:
        end = start + len(target)
        before_ok = start == 0 or line[start - 1] in " ="
        after_ok = end == len(line) or line[end] in " /"
        if before_ok and after_ok:
            return True
        start = line.find(target, start + 1)
    return False


def _pids() -> list[int]:
    return [int(name) for name in os.listdir(_PROC) if name.isdigit()]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for pid in _pids():
        info = _stat(pid)
        if info is not None and info[1] == pgid and _live(info[0]):
            members.append(pid)
    return members


def _settled_cmdline(pid: int) -> list[str]:
    """The command line of a live process, waiting out an exec() in progress.

    For a moment inside execve() the new command line reads empty; Debian's chromium wrapper
    script execs the browser right after it starts, and a sandbox whose only member was caught
    then looked gone (its watchdog left at once, failing the start).
    """
    for _ in range(10):
        args = _cmdline(pid)
        info = _stat(pid)
        if args or info is None or not _live(info[0]):
            return args
        time.sleep(0.002)
    return _cmdline(pid)


def group_alive(pgid: int, workdir: str) -> bool:
    """Whether the sandbox's browser group still has a live process that is really ours.

    Every Chromium process carries ``--user-data-dir=<workdir>/...`` on its command line; checking
    that keeps a recycled process-group id from being mistaken for (and killed as) the browser.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # a group of another user: certainly not ours
    return any(mentions(_settled_cmdline(pid), workdir) for pid in group_members(pgid))


def strays(workdir: str, exclude: Iterable[int] = ()) -> list[int]:
    """Live processes anywhere on the host whose command line refers to ``workdir``."""
    skip = {os.getpid(), *exclude}
    found = []
    for pid in _pids():
        if pid in skip:
            continue
        info = _stat(pid)
        if info is not None and _live(info[0]) and mentions(_cmdline(pid), workdir):
            found.append(pid)
    return found


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait(condition_gone: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while True:
        if condition_gone():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)


def stop_browser(
    workdir: str,
    pgid: int | None,
    leader: int | None,
    *,
    grace: float = 1.0,
    exclude: Iterable[int] = (),
) -> None:
    """Stop every process of the sandbox: politely, then not.

    SIGTERM goes to the leader first: Chromium then shuts its own children down in order, which
    takes ~0.1 s instead of the ~0.5-0.9 s of a group-wide SIGTERM (where every child dies at
    once and the browser process handles each as a crash). After ``grace`` the whole group gets
    SIGKILL. Last, anything elsewhere on the host still naming the workdir (a helper that left
    the group by calling setsid, e.g. a crash handler) is killed too.
    """
    if pgid is not None and group_alive(pgid, workdir):
        leader_info = _stat(leader) if leader is not None else None
        if leader is not None and leader_info and leader_info[1] == pgid and _live(leader_info[0]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(leader, signal.SIGTERM)
        else:
            _signal_group(pgid, signal.SIGTERM)
        if not _wait(lambda: not group_alive(pgid, workdir), grace):
            _signal_group(pgid, signal.SIGKILL)
            _wait(lambda: not group_alive(pgid, workdir), 5.0)
    for _ in range(3):
        left = strays(workdir, exclude)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _wait(lambda: not strays(workdir, exclude), 2.0)


def remove_workdir(workdir: Path) -> bool:
    """Remove a sandbox's working directory; True if it is gone afterwards.

    Only a directory carrying the sandbox marker is removed, and the marker goes last, so a
    corrupted or forged record cannot make us delete an arbitrary directory, while a removal cut
    short (the remover was killed) can still be finished later by anyone.
    """
    if workdir.is_symlink():
        return False
    if not workdir.exists():
        return True
    if not (workdir / MARKER).is_file():
        return False

    def ignore_vanished(_func: object, _path: str, exc_info: _ExcInfo) -> None:
        # The watchdog, the reaper and destroy() may race to remove the same tree.
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    # A browser still dying, or a start still under way, can write into the directory while it
    # is being emptied: a few passes let those last writes land and go too.
    for attempt in range(REMOVE_PASSES):
        if attempt:
            time.sleep(REMOVE_PAUSE_SECONDS)
        for child in list(workdir.iterdir()):
            if child.name == MARKER:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, onerror=ignore_vanished)
            else:
                with contextlib.suppress(FileNotFoundError):
                    child.unlink()
        with contextlib.suppress(FileNotFoundError):
            (workdir / MARKER).unlink()
        try:
            workdir.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            # Something was written meanwhile. The marker goes back, so that the next pass, or
            # whoever removes the sandbox next (its starter, the watchdog, housekeeping), may
            # still finish: without it every later attempt would refuse the directory.
            with contextlib.suppress(OSError):
                (workdir / MARKER).touch(mode=0o600)
            continue
        return True
    return False
