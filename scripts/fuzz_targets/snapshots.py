"""oxisnap and oxispec: snapshot readers on mutated real snapshots of the
fuzz-seed model (a few kilobytes each), restored into an engine that then
generates. A mutation almost never keeps the BLAKE3 checksum right, so an
input that fails on its checksum is read a second time resealed (digests
and lengths recomputed, nested OXISNAP1 sections first): the fuzzer then
reaches the sections, the JSON, the sampler state and the KV import."""

from __future__ import annotations

import struct
from pathlib import Path

from oxillama import Engine, Grammar, Model, SamplerConfig, SpeculativeEngine, _native
from oxillama import sessions as snapshot
from oxillama.sessions import SnapshotFormatError
from oxillama.sessions import spec as spec_format
from oxillama.sessions.format import HEADER, SECTION

from . import Target
from .tiny_model import tiny_model_bytes

SNAP_MAGIC = b"OXISNAP1"
GBNF = 'root ::= "a" [a-z]* " " root | "."\n'


def _seal(blob: bytearray, at: int, end: int) -> None:
    """Recomputes the length and digest of the container at blob[at:end]."""
    if end - at >= HEADER.size:
        struct.pack_into("<Q", blob, at + 12, end - at - HEADER.size)
        blob[at + 20 : at + 52] = _native.blake3(bytes(blob[at + HEADER.size : end]))


def reseal(data: bytes) -> bytes:
    """`data` with every container's checksum made right again: the
    OXISNAP1 images nested as sections (OXISPEC1), then the outer one."""
    blob = bytearray(data)
    pos = HEADER.size
    while pos + SECTION.size <= len(blob):
        _, n = SECTION.unpack_from(blob, pos)
        start, end = pos + SECTION.size, pos + SECTION.size + n
        if end > len(blob):
            break
        if blob[start : start + 8] == SNAP_MAGIC:
            _seal(blob, start, end)
        pos = end
    _seal(blob, 0, len(blob))
    return bytes(blob)


class _SnapshotTarget(Target):
    def setup(self, workdir: Path) -> None:
        self.model_path = workdir / "tiny.gguf"
        self.model_path.write_bytes(tiny_model_bytes())
        self.model = Model(self.model_path)

    def engine(self, sampler: SamplerConfig) -> Engine:
        return Engine(self.model, context_size=64, threads=1, sampler=sampler)

    def read(self, blob: bytes) -> None:
        raise NotImplementedError

    def run(self, value: bytes) -> None:
        try:
            self.read(value)
        except SnapshotFormatError as e:
            if "checksum" not in str(e):
                raise
            self.read(reseal(value))


class Oxisnap(_SnapshotTarget):
    name = "oxisnap"

    def seeds(self) -> list[bytes]:
        out = [self.engine(SamplerConfig.greedy()).snapshot_bytes()]
        e = self.engine(SamplerConfig.greedy())
        e.generate("The cat", 4)
        out.append(e.snapshot_bytes())
        e = self.engine(
            SamplerConfig(
                temperature=0.8, seed=3, repetition_penalty=1.1, dry_multiplier=0.5, mirostat=2
            )
        )
        e.generate("Once upon", 5)
        out.append(e.snapshot_bytes())
        e = self.engine(SamplerConfig.greedy())
        e.generate("List:", 4, grammar=Grammar(GBNF))
        out.append(e.snapshot_bytes())
        return out

    def read(self, blob: bytes) -> None:
        engine = Engine.from_state(snapshot.read(blob, model=self.model))
        engine.generate("" if engine.n_past else "Hi", 2)


class Oxispec(_SnapshotTarget):
    name = "oxispec"

    def seeds(self) -> list[bytes]:
        out = []
        for prompt, n, grammar in (("", 0, None), ("The cat", 6, None), ("A", 5, GBNF)):
            spec = SpeculativeEngine(
                self.engine(SamplerConfig.greedy()),
                self.engine(SamplerConfig.greedy()),
                num_speculative=3,
                seed=5,
            )
            if n:
                spec.generate(prompt, n, grammar=grammar)
            out.append(spec_format.dumps(spec))
        return out

    def read(self, blob: bytes) -> None:
        spec = spec_format.loads(
            blob, target_model_path=self.model_path, draft_model_path=self.model_path
        )
        spec.generate("" if spec.target.n_past else "Hi", 2)


TARGETS = {"oxisnap": Oxisnap, "oxispec": Oxispec}
