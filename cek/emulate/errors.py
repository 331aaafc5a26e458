"""KernelError: a failure the emulator found in a kernel."""

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
