"""Find and read the `.cu` sources.

The `.cu` files live in `kernels/` at the repository root; a built wheel carries them as
`cek/_kernels/`. Local `#include "..."` lines are inlined, each file opened with a `#line`
directive, so that `Kernel.source` is self-contained (its hash covers the headers, and CuPy's
disk cache, keyed on the source text, cannot serve a module built from an older header) and
compiler errors still name the real file and line. The `#line` paths are `kernels/<file>`,
wherever the package lives, so one kernel has one source text (and one cache key) in every
checkout, virtual environment and wheel.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$")


@functools.lru_cache(maxsize=None)
def kernels_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_kernels", here.parent / "kernels"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no kernels directory beside {here}")


def display_name(path: Path) -> str:
    """The name `#line` gives a file of the kernels directory: `kernels/<relative path>`."""
    return f"kernels/{path.relative_to(kernels_dir().resolve()).as_posix()}"


def _expand(path: Path, seen: set[Path]) -> list[str]:
    name = display_name(path)
    out = [f'#line 1 "{name}"']
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = _INCLUDE.match(line)
        if match:
            header = (path.parent / match.group(1)).resolve()
            if header.is_file():
                if header not in seen:
                    seen.add(header)
                    out.extend(_expand(header, seen))
                out.append(f'#line {number + 1} "{name}"')
                continue
        # The header is inlined once, so its guard would only draw a warning in the main file.
        out.append("" if _PRAGMA_ONCE.match(line) else line)
    return out


@functools.lru_cache(maxsize=None)
def load_kernel_source(filename: str) -> str:
    """The text of kernels/<filename> with its local headers inlined."""
    path = kernels_dir() / filename
    if not path.is_file():
        raise FileNotFoundError(f"kernel source {path} not found")
    return "\n".join(_expand(path.resolve(), set())) + "\n"
