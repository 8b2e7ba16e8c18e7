"""What every family's report shares: per-role counts of what trains, their totals, JSON and table."""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..roles import Role


@dataclass
class RoleCount:
    role: Role
    total: int
    trainable: int

    @property
    def share(self) -> float:
        return self.trainable / self.total if self.total else 0.0


class CountedByRole:
    """What freezing and peft reports share: totals, JSON and the table of their per-role ``counts()``
    (subclasses have ``model_name``, ``policy.name`` and ``role_map``)."""

    def counts(self) -> list[RoleCount]:
        raise NotImplementedError

    @property
    def total(self) -> int:
        return sum(row.total for row in self.counts())

    @property
    def num_trainable(self) -> int:
        return sum(row.trainable for row in self.counts())

    @property
    def trainable_share(self) -> float:
        return self.num_trainable / self.total if self.total else 0.0

    def counts_dict(self) -> dict:
        """Model, policy and the per-role counts, the part of ``to_dict`` every report shares."""
        return {
            "model": self.model_name,
            "policy": self.policy.name,
            "roles": [
                {"role": row.role.value, "total": row.total, "trainable": row.trainable, "share": round(row.share, 6)}
                for row in self.counts()
            ],
            "total": self.total,
            "trainable": self.num_trainable,
            "trainable_share": round(self.trainable_share, 6),
            "num_blocks": self.role_map.num_blocks,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def _where(self) -> dict:
        """Per role: the blocks it lives in and the top-level tensors or modules outside blocks
        ('blocks 0-11', 'head, head_dist', 'cls_token, dist_token')."""
        blocks, outside = {}, {}
        for entry in self.role_map:
            if entry.block is not None:
                blocks.setdefault(entry.role, set()).add(entry.block)
            else:
                outside.setdefault(entry.role, {})[self.role_map.top_level(entry.name)] = None
        where = {}
        for role in set(blocks) | set(outside):
            parts = []
            if role in blocks:
                low, high = min(blocks[role]), max(blocks[role])
                parts.append(f"blocks {low}-{high}" if high > low else f"block {low}")
            names = list(outside.get(role, {}))
            parts += names[:4] + ([f"+{len(names) - 4} more"] if len(names) > 4 else [])
            where[role] = ", ".join(parts)
        return where

    def counts_table(self) -> list[str]:
        """The header and per-role lines of ``format_table``."""
        lines = [f"model: {self.model_name}   policy: {self.policy.name}   blocks: {self.role_map.num_blocks}", ""]
        lines.append(f"{'role':<12} {'params':>14} {'trainable':>14} {'share':>8}   where")
        where = self._where()
        for row in self.counts():
            lines.append(f"{row.role.value:<12} {row.total:>14,} {row.trainable:>14,} {row.share:>8.1%}   "
                         f"{where.get(row.role, '')}".rstrip())
        lines.append(f"{'total':<12} {self.total:>14,} {self.num_trainable:>14,} {self.trainable_share:>8.1%}")
        return lines
