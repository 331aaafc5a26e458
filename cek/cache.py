"""What cek may load from its build cache: code that only the current user could have put there.

Loading a library runs its code (its constructors) in the calling process, and the name of each
cached file is a digest anyone on the machine can compute, so its checksum proves nothing about
who wrote it. A cached file is used only when every folder from the cache root down to it, and
the file itself, belong to the current user and neither group nor others may write them (as ssh
treats a key file). Otherwise cek builds into a fresh private folder for this process and says
once on stderr why, naming the folder and the fix. Folders cek creates are private (0700).

Files are read, never loaded, to tell whether a library defines the symbols cek calls: an
emulator library built with a sanitizer cannot be loaded in this process at all.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import struct
import sys
import tempfile
import threading
from pathlib import Path

_said: set[str] = set()
_private: list[tuple[int, Path]] = []  # (pid, folder): a forked child makes its own
_lock = threading.Lock()


def make_private(folder: Path) -> None:
    """Create each missing level of `folder` with mode 0700 (mkdir's `parents` would give the
    levels above the last one the default mode)."""
    missing = []
    for level in (folder, *folder.parents):
        if level.exists():  # a file here fails below, as mkdir would (Not a directory)
            break
        missing.append(level)
    for level in reversed(missing):
        try:
            level.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process; checked by distrust()
            if not level.is_dir():
                raise


def distrust(root: Path, path: Path) -> tuple[Path, str] | None:
    """The first of `root`, the folders below it and `path` that another user could have
    written, with the reason; None when all are the current user's alone (or do not exist)."""
    levels = [root, *reversed([p for p in path.parents if p.is_relative_to(root) and p != root])]
    for level in (*levels, path):
        try:
            info = level.stat()
        except FileNotFoundError:
            return None  # nothing below it to load; cek creates it privately
        if info.st_uid != os.geteuid():
            return level, f"it belongs to uid {info.st_uid}, not to you (uid {os.geteuid()})"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return level, (f"group or others can write to it "
                           f"(mode {stat.S_IMODE(info.st_mode):04o})")
    return None


def usable(root: Path, path: Path) -> Path:
    """`path` (a file under `root`, or the name it will have; its folder made) when it may be
    loaded; else the same name in this process's private folder, after saying why once on
    stderr."""
    found = distrust(root, path)
    if found is None:
        return path
    level, reason = found
    instead = private_folder() / path.parent.name
    instead.mkdir(mode=0o700, exist_ok=True)
    if level == path:
        fix = f"remove it (rm {level})"
    elif reason.startswith("group"):
        fix = (f"make it yours alone (chmod go-w {level}) or set CEK_CACHE_DIR to a folder only "
               "you can write")
    else:
        fix = "set CEK_CACHE_DIR to a folder of your own"
    say(f"cek: not loading native code from {level}: {reason}. Building in {instead} for this "
        f"process instead; to cache again, {fix}.")
    return instead / path.name


def private_folder() -> Path:
    """A fresh folder of this process (mode 0700), removed when it exits."""
    with _lock:
        if not _private or _private[0][0] != os.getpid():
            folder = Path(tempfile.mkdtemp(prefix="cek-"))
            _private[:] = [(os.getpid(), folder)]
            atexit.register(_remove, os.getpid(), folder)
        return _private[0][1]


def _remove(pid: int, folder: Path) -> None:
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)


def say(line: str) -> None:
    """`line` on stderr, once a process. Never stdout, which is the calling program's; a closed
    stderr (or none, under pythonw) costs the line, not the work."""
    with _lock:
        if line in _said:
            return
        _said.add(line)
    if sys.stderr is None:
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def missing_symbols(library: Path, names) -> list[str]:
    """Those of `names` that `library` does not export, read from its ELF dynamic symbol table
    without loading it; [] when it is not a 64-bit little-endian ELF file (loading will tell)."""
    data = library.read_bytes()
    if data[:6] != b"\x7fELF\x02\x01":
        return []
    defined = set()
    try:
        (section_table,) = struct.unpack_from("<Q", data, 0x28)
        entry_size, count = struct.unpack_from("<HH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_table + i * entry_size)
                    for i in range(count)]
        for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
            if kind != 11 or not symbol_size:  # SHT_DYNSYM
                continue
            strings = sections[link][4]
            for at in range(offset, offset + size, symbol_size):
                name, _, _, section = struct.unpack_from("<IBBH", data, at)
                if section:  # 0: undefined here, wanted from another library
                    start = strings + name
                    defined.add(data[start:data.index(b"\0", start)].decode(errors="replace"))
    except (struct.error, IndexError, ValueError):  # a file cut short or garbled
        pass
    return [name for name in names if name not in defined]
