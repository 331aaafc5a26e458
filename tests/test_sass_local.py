"""compile tier: the report's local-memory counters (LDL/STL) on a kernel that does use local
memory (tests/sass/local_array.cu), where every cek kernel counts 0 of each."""

from types import SimpleNamespace

import pytest

from cek import sass
from cek.compile import compile_kernel
from test_report import SASS_DIR, needs_nvdisasm

pytestmark = pytest.mark.compile


@needs_nvdisasm
def test_local_loads_and_stores_are_counted():
    source = (SASS_DIR / "local_array.cu").read_text()
    compiled = compile_kernel(SimpleNamespace(id="local_array", source=source), "sm_90")
    assert compiled.stack_bytes == 32 * 4  # the table, as ptxas reports it
    facts = sass.facts(sass.disassemble(compiled.cubin))
    # 128 bytes filled 16 at a time (8), the indexed write (1); the indexed read (1).
    assert (facts.local_stores, facts.local_loads) == (9, 1)
    assert facts.loads == {32: 1}  # the index: local accesses are not global loads
