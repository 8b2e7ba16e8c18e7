"""What a family that adds modules trains: its added tensors (under the role the family gives each) and the head,
counted per role like every family's report."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...roles import Role, RoleMap
from ..report import CountedByRole, RoleCount
from .spec import AddedPolicy


@dataclass
class AddedReport(CountedByRole):
    """``total`` counts the base's parameters by role plus the added ones; ``trainable`` the added tensors and the
    head. ``method_name`` is the family's (set per instance: one report class serves every such family)."""

    method_name: str
    model_name: str
    policy: AddedPolicy
    role_map: RoleMap  # the base's, before anything was added
    base_fingerprint: str
    added: dict[str, tuple[int, Role]] = field(default_factory=dict)  # tensor name -> (numel, role it counts under)
    head: list[str] = field(default_factory=list)  # the head's tensors, trained whole

    def counts(self) -> list[RoleCount]:
        rows = {role: RoleCount(role, 0, 0) for role in Role}
        for entry in self.role_map:
            rows[entry.role].total += entry.numel
            if entry.name in self.head:
                rows[entry.role].trainable += entry.numel
        for numel, role in self.added.values():
            rows[role].total += numel
            rows[role].trainable += numel
        return [row for row in rows.values() if row.total or row.trainable]

    @property
    def num_added(self) -> int:
        return sum(numel for numel, _ in self.added.values())

    def to_dict(self) -> dict:
        return {**self.counts_dict(), "method": self.policy.family, "options": asdict(self.policy.options),
                "added": {name: numel for name, (numel, _) in self.added.items()}, "added_params": self.num_added,
                "head_tensors": self.head}

    def format_table(self) -> str:
        lines = self.counts_table()
        lines.append(f"\n{self.policy.family} adds {self.num_added:,} weights in {len(self.added)} tensors; "
                     f"head trained whole: {', '.join(self.head) or 'no'}")
        return "\n".join(lines)

    def remove_hooks(self) -> None:
        """Nothing to remove: the base's tensors are frozen, not masked (the freezing policies' parity)."""
