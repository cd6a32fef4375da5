"""A file whose ``general.architecture`` we do not run is refused with a
LoadError that names it and lists what we do run, which includes every
architecture these tests check against llama.cpp."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oxillama import Engine
from oxillama.errors import LoadError
from tests.models import _checks as c
from tests.models._archs import ALL_FIXTURES
from tests.models._rewrite import rewrite

TESTED = sorted({ALL_FIXTURES[c.reference(n).fixture].arch for n in c.REFERENCES})


# Real llama.cpp architectures we do not run, and a name nobody uses.
@pytest.mark.parametrize("arch", ["falcon", "gptneox", "rwkv7", "t5", "not-an-architecture"])
def test_an_architecture_we_do_not_run_is_a_load_error_naming_it(arch: str, tmp_path: Path) -> None:
    # The llama fixture under another name: a valid file in every other way.
    path = tmp_path / f"{arch}.gguf"
    rewrite(c.reference("llama").path, path, arch=arch)
    with pytest.raises(LoadError) as err:
        Engine(path, context_size=64)
    msg = str(err.value)
    assert f'unsupported architecture "{arch}"' in msg
    listed = re.search(r"\(supported: ([^)]*)\)", msg)
    assert listed is not None, msg
    assert set(TESTED) <= set(listed.group(1).split(", ")), msg
