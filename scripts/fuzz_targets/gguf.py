"""gguf-bytes and gguf-file: a GGUF image through the whole loader (the
Rust parser, the model's shape checks, the tokenizer and chat template
built from its metadata), then two greedy tokens when it loads. The same
mutated bytes go in from memory and, for gguf-file, from a file that is
memory-mapped."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from oxillama import Engine, Model, SamplerConfig, _native
from oxillama.model.paths import default_model_path
from tests._gguf_builder import small_model_file

from . import Target
from .tiny_model import tiny_model, tiny_model_bytes

# The real file's header and the start of its metadata (the tokenizer's
# arrays begin within it), cut where a reader must notice the truncation.
SMOLLM2_PREFIX = 16 * 1024


def _exercise(gguf: _native.GgufFile, model: Model) -> None:
    for name, *_ in gguf.tensors()[:4]:
        gguf.tensor_bytes(name)
    engine = Engine(model, context_size=16, threads=1, sampler=SamplerConfig.greedy())
    engine.generate("Hi there", 2)
    model.chat_template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)


class GgufBytes(Target):
    name = "gguf-bytes"

    def seeds(self) -> list[bytes]:
        small = small_model_file()
        v2 = tiny_model()
        v2.version = 2
        with default_model_path().open("rb") as f:
            prefix = f.read(SMOLLM2_PREFIX)
        return [tiny_model_bytes(), v2.build(), small.build(), prefix]

    def run(self, value: bytes) -> None:
        gguf = _native.GgufFile.from_bytes(value)
        gguf.metadata()
        _exercise(gguf, Model.from_bytes(value))


class GgufFile(GgufBytes):
    name = "gguf-file"

    def setup(self, workdir: Path) -> None:
        self.dir = workdir
        self.count = itertools.count()

    def run(self, value: bytes) -> None:
        # A new name per input: `Model(path)` caches by file identity.
        path = self.dir / f"input-{next(self.count)}.gguf"
        path.write_bytes(value)
        try:
            gguf = _native.GgufFile.open(str(path))
            gguf.metadata()
            _exercise(gguf, Model(path))
        finally:
            os.unlink(path)


TARGETS = {"gguf-bytes": GgufBytes, "gguf-file": GgufFile}
