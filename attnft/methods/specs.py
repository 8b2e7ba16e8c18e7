"""The grammar every family's policy specs share: ``+ROLE`` / ``-ROLE`` edits and ``@BLOCKS`` (``@8-11``,
``@0,2,4``), and the one rule that a spec's blocks exist in the model."""
from __future__ import annotations

import re
from typing import Optional

from ..core.errors import UnknownPolicyError
from ..core.parsing import short

POLICY_EDIT = re.compile(r"([+-])([A-Za-z_]+)")
MAX_BLOCK_INDEX = 9_999  # beyond any model: a range past it is refused before it is built


def parse_blocks(text: str, spec: str) -> frozenset[int]:
    """The block indices of ``@BLOCKS`` (``8-11``, ``0,2,4``); each range ordered and within :data:`MAX_BLOCK_INDEX`."""
    blocks = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d{1,30})\s*(?:-\s*(\d{1,30})\s*)?", part)
        if m is None:
            raise UnknownPolicyError(f"cannot read blocks {short(text, 40)!r} in policy {short(spec, 60)!r}: use indices "
                                     "and ranges like '@8-11' or '@0,2,4'")
        start, stop = int(m.group(1)), int(m.group(2) or m.group(1))
        if stop > MAX_BLOCK_INDEX:
            raise UnknownPolicyError(f"policy {short(spec, 60)!r} names block {stop}: no model has that many blocks")
        if start > stop:
            raise UnknownPolicyError(f"policy {short(spec, 60)!r}: the range {start}-{stop} is empty; write it low-high")
        blocks.update(range(start, stop + 1))
    return frozenset(blocks)


def check_blocks(blocks: Optional[frozenset[int]], num_blocks: int, spec: str, model_name: str = "the model") -> None:
    """UnknownPolicyError if ``@BLOCKS`` of policy ``spec`` names a block the model does not have."""
    missing = sorted(b for b in blocks or () if b >= num_blocks)
    if missing:
        shown = ", ".join(map(str, missing[:4])) + (" ..." if len(missing) > 4 else "")
        have = f"0-{num_blocks - 1}" if num_blocks > 1 else "0" if num_blocks == 1 else "none"
        raise UnknownPolicyError(f"policy {short(spec, 60)!r} names block(s) {shown}, but {model_name} has {num_blocks} "
                                 f"blocks (indices {have})")
