"""KernelError: a failure the emulator found in a kernel; CacheDirError: no usable build cache."""

from __future__ import annotations

import re

# Messages from the runtime and from the sanitizer reports start with "file:line: ".
_LOCATION = re.compile(r"^(?P<file>[^\n:]+):(?P<line>\d+): ")


class KernelError(RuntimeError):
    """A race, an out-of-bounds access, a misused barrier or shuffle, a deadlock, a misaligned
    access or a crash, found while running a kernel. `file` and `line` name the kernel source
    line when it is known, else they are None."""

    def __init__(self, message: str):
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
