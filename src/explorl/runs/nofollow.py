"""Writing inside a directory someone else may have filled, without following a symbolic link planted there.

A run directory, a report folder and the contents of an `--out` directory are untrusted input at rest: shared,
downloaded, or prepared by another user of the machine. A link planted in one (`metrics.jsonl.tmp -> ~/.bashrc`,
`checkpoints -> ~/data`) would make an ordinary write, rename or delete reach outside it. So inside such a
directory (`root`) explorl touches only real files and directories: the path it writes, renames or removes, and
every directory between `root` and it, are looked at with `os.lstat`, and a link is refused by name (`LinkRefused`)
before anything is written. `root` itself is the user's choice (a run directory may be a link to a scratch disk) and
is not checked; it defaults to the directory holding the path, so that at least the path itself is never followed.
Files are created with O_CREAT|O_EXCL|O_NOFOLLOW and appended to with O_APPEND|O_NOFOLLOW, so their last component
is not followed even if it changed after the check.

What this does not do: stop a process running beside explorl that swaps a directory for a link between the check
and the write (a race, not a directory at rest); O_NOFOLLOW closes that for the last component only.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class LinkRefused(ValueError):
    """A symbolic link where explorl was to write, rename or delete inside a run directory or an output folder. A
    ValueError, so the command line prints it as one error line."""


def _refused(links: list[Path]) -> LinkRefused:
    def shown(p: Path) -> str:
        try:
            return f"{p} (-> {os.readlink(p)})"
        except OSError:
            return str(p)

    what = (f"{shown(links[0])} is a symbolic link" if len(links) == 1
            else f"{', '.join(map(shown, links))} are symbolic links")
    return LinkRefused(f"{what}: explorl does not write, rename or delete through a link in a run directory or an "
                       f"output folder, since that could reach outside it. Remove the link: a run directory holds no "
                       f"symbolic links")


def _is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def check(path: str | Path, root: str | Path | None = None) -> Path:
    """`path`, once neither it nor a directory between `root` and it is a symbolic link (LinkRefused naming it
    otherwise). `root` defaults to the directory holding `path`: then `path` alone is checked."""
    path = Path(path)
    current = Path(root) if root is not None else path.parent
    for part in path.relative_to(current).parts:
        current = current / part
        if _is_link(current):
            raise _refused([current])
    return path


def refuse_linked_entries(directory: str | Path) -> None:
    """LinkRefused naming every symbolic link among `directory`'s entries (none when it does not exist): how a run
    directory is looked over before a run starts or resumes, so a planted link stops it before any work."""
    try:
        with os.scandir(directory) as entries:
            links = sorted(Path(directory) / e.name for e in entries if e.is_symlink())
    except (FileNotFoundError, NotADirectoryError):
        return
    if links:
        raise _refused(links)


def make_dirs(path: str | Path, root: str | Path | None = None) -> Path:
    """`path` as a real directory, made with the missing ones between `root` and it (and `root` itself, the user's
    own, when missing); LinkRefused when one of them is a symbolic link, NotADirectoryError when it is a file."""
    path = Path(path)
    current = Path(root) if root is not None else path.parent
    current.mkdir(parents=True, exist_ok=True)
    for part in path.relative_to(current).parts:
        current = current / part
        try:
            os.mkdir(current)  # never follows a link: an existing one, even dangling, is EEXIST
        except FileExistsError:
            if _is_link(current):
                raise _refused([current]) from None
            if not current.is_dir():
                raise NotADirectoryError(f"{current}: a file where a directory belongs; remove it") from None
    return path


def remove(path: str | Path, root: str | Path | None = None) -> None:
    """Remove `path` (a file, or a directory with everything below it) if it exists, once `check` passes. Python's
    `shutil.rmtree` follows no link below the directory it is given but resolves that directory's own path, so a
    linked parent would take it elsewhere: hence the check, and never `ignore_errors`."""
    path = check(path, root)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def replace(src: str | Path, dst: str | Path, root: str | Path | None = None) -> None:
    """`os.replace(src, dst)`, neither of them (nor a directory between `root` and them) a symbolic link."""
    os.replace(check(src, root), check(dst, root))


def open_fd(path: Path, flags: int, mode: int = 0o666) -> int:
    """`os.open(path, flags, mode)` with O_NOFOLLOW (a new file gets `mode` less the umask; 0o666 as `open` gives):
    LinkRefused when `path` is a symbolic link."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link appeared after the check
            raise _refused([path]) from None
        raise


@contextmanager
def open_new(path: str | Path, root: str | Path | None = None, mode: str = "w") -> Iterator:
    """`path` opened for writing as a new file (text in UTF-8, or bytes with mode "wb"): a regular file of that name
    (left over by a killed run) is removed first, then the file is created with O_EXCL|O_NOFOLLOW, so it is never a
    link's target nor a file another process holds open."""
    path = check(path, root)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        yield f


@contextmanager
def open_append(path: str | Path, root: str | Path | None = None) -> Iterator:
    """`path` opened for appending text (UTF-8; created if missing) with O_APPEND|O_NOFOLLOW."""
    fd = open_fd(check(path, root), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        yield f


def write_file(path: str | Path, data: str | bytes, root: str | Path | None = None) -> Path:
    """`path` written as a new file holding `data` (`open_new`)."""
    with open_new(path, root, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return Path(path)


def write_atomic(path: str | Path, data: str | bytes, root: str | Path | None = None) -> Path:
    """`path` written whole under `<name>.tmp` (`open_new`), fsynced and renamed onto it: a kill leaves the old file
    or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open_new(tmp, root, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    replace(tmp, path, root)
    return path
