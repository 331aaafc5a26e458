"""KernelError: a failure the emulator found in a kernel; CacheDirError: no usable build cache."""

from __future__ import annotations

import re
import shutil
import subprocess

# Messages from the runtime and from the sanitizer reports start with "file:line: ".
_LOCATION = re.compile(r"^(?P<file>[^\n:]+):(?P<line>\d+): ")
# The path that reached a barrier or a shuffle, as the runtime writes it (runtime.cpp,
# path_token): the kernel's library and the return addresses' offsets into it, innermost first.
_PATH = re.compile(
    r" \{cek-path\t(?P<library>[^\t]+)\t(?P<site>[^\t]+)\t(?P<offsets>[0-9a-f,]+)\}")
_KERNEL_LINE = re.compile(r"^(?P<where>\S+\.(?:cu|cuh):\d+)")
# A relative `#line` name (kernels/..., as cek.sources writes them) comes back joined to the
# scratch folder the library was built in (cek/emulate/build.py): the name is what follows it.
_BUILD_FOLDER = re.compile(r"^.*/\.build-[^/]+/")


def _callers(library: str, site: str, offsets: str) -> str:
    """ " (called from a.cu:14, from b.cuh:30)": the kernel source lines of a path's callers,
    inlined ones included (addr2line -i reads the library's line tables), innermost first; the
    site's own line, which the message names already, left out."""
    addr2line = shutil.which("addr2line")
    if addr2line is None:
        return f" (reached by offsets {offsets} of {library})"
    # A return address is the instruction after the call: one byte back is the call's line.
    addresses = [f"{int(o, 16) - 1:#x}" for o in offsets.split(",")]
    out = subprocess.run([addr2line, "-i", "-e", library, *addresses], capture_output=True,
                         text=True).stdout
    lines = []
    for text in out.splitlines():
        match = _KERNEL_LINE.match(text.strip())
        where = _BUILD_FOLDER.sub("", match["where"]) if match else None
        if where and (not lines or lines[-1] != where):
            lines.append(where)
    callers = lines[1:] if lines and lines[0].endswith(site.rpartition("/")[2]) else lines
    return f" (called from {', from '.join(callers)})" if callers else ""


def describe_paths(message: str) -> str:
    """The runtime's message with each path token written as the source lines of its callers."""
    return _PATH.sub(lambda m: _callers(m["library"], m["site"], m["offsets"]), message)


class KernelError(RuntimeError):
    """A race, an out-of-bounds access, a misused barrier or shuffle, a deadlock, a misaligned
    access or a crash, found while running a kernel. `file` and `line` name the kernel source
    line when it is known, else they are None."""

    def __init__(self, message: str):
        message = describe_paths(message)
        super().__init__(message)
        match = _LOCATION.match(message)
        self.file = match["file"] if match else None
        self.line = int(match["line"]) if match else None


class CacheDirError(OSError):
    """The emulator's build cache folder cannot be created or written. The message is one line
    naming the folder and the variable that chooses another."""

    def __init__(self, path, reason: str):
        super().__init__(f"cannot use {path} as the emulator's build cache ({reason}); "
                         "set CEK_CACHE_DIR to a writable folder")
        self.path = path
