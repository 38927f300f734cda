# The C scanner of a batch's JSON bytes (_scan.c); see stepscope.traces.typed.decode_batch.
from collections.abc import Callable
from typing import Any

SOURCE_SHA: str

class Parsed:
    def __len__(self) -> int: ...

class Scanner:
    def __init__(self, ids: dict[str, int], intern: Callable[[str], int], scalar: Callable[[Any], int],
                 dims: Callable[[bytes], int | None], /) -> None: ...
    def columns(self, parsed: Parsed, /) -> tuple[dict[str, bytes], list[tuple[str, int]], int,
                                                  dict[str, bytes] | None] | None: ...

def parse(piece: bytes | bytearray, /) -> Parsed | None: ...
