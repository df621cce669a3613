"""The roles people hold and the capabilities each grants (no Django imports).

Capabilities are permission codenames of the ``core`` app; groups named after the roles hold them.
Checking capabilities rather than group names keeps every check in one vocabulary and lets an
installation grant a single capability to a person without inventing a role.
"""

from __future__ import annotations

from enum import StrEnum


class Capability(StrEnum):
    VIEW_WORKFLOWS = "view_workflows"
    AUTHOR_WORKFLOWS = "author_workflows"
    LAUNCH_RUNS = "launch_runs"
    VIEW_RUNS = "view_runs"
    CONTROL_RUNS = "control_runs"
    VIEW_APPROVALS = "view_approvals"
    DECIDE_APPROVALS = "decide_approvals"
    VIEW_AUDIT = "view_audit"
    EXPORT_AUDIT = "export_audit"
    VIEW_SYSTEM = "view_system"

    @property
    def perm(self) -> str:
        """The ``app_label.codename`` string that ``user.has_perm`` takes."""
        return f"core.{self.value}"


CAPABILITY_LABELS: dict[Capability, str] = {
    Capability.VIEW_WORKFLOWS: "Can see workflows",
    Capability.AUTHOR_WORKFLOWS: "Can write and publish workflows",
    Capability.LAUNCH_RUNS: "Can launch and cancel runs",
    Capability.VIEW_RUNS: "Can watch runs and their evidence",
    Capability.CONTROL_RUNS: "Can take control of a running run's browser",
    Capability.VIEW_APPROVALS: "Can see the approvals queue",
    Capability.DECIDE_APPROVALS: "Can approve or reject irreversible steps",
    Capability.VIEW_AUDIT: "Can read the audit trail",
    Capability.EXPORT_AUDIT: "Can export and verify the audit trail",
    Capability.VIEW_SYSTEM: "Can see the system status",
}


class Role(StrEnum):
    OPERATORS = "Operators"
    REVIEWERS = "Reviewers"
    COMPLIANCE = "Compliance"
    ADMINS = "Admins"


ROLE_CAPABILITIES: dict[Role, frozenset[Capability]] = {
    Role.OPERATORS: frozenset(
        {
            Capability.VIEW_WORKFLOWS,
            Capability.AUTHOR_WORKFLOWS,
            Capability.LAUNCH_RUNS,
            Capability.VIEW_RUNS,
            # Reviewers and compliance never: who decides on an action must not have done it.
            Capability.CONTROL_RUNS,
        }
    ),
    Role.REVIEWERS: frozenset(
        {
            Capability.VIEW_WORKFLOWS,
            Capability.VIEW_RUNS,
            Capability.VIEW_APPROVALS,
            Capability.DECIDE_APPROVALS,
        }
    ),
    # Compliance reads everything and exports, but changes nothing.
    Role.COMPLIANCE: frozenset(
        {
            Capability.VIEW_WORKFLOWS,
            Capability.VIEW_RUNS,
            Capability.VIEW_APPROVALS,
            Capability.VIEW_AUDIT,
            Capability.EXPORT_AUDIT,
        }
    ),
    Role.ADMINS: frozenset(Capability),
}

# One demo person per role; usernames are what the README and the quick start print.
DEMO_USERS: dict[Role, str] = {
    Role.OPERATORS: "olivia.operator",
    Role.REVIEWERS: "rory.reviewer",
    Role.COMPLIANCE: "carla.compliance",
    Role.ADMINS: "ada.admin",
}
