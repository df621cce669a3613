"""Every change to workflows and credentials: one transaction, the workflow row locked, one audit
event. Views call these and nothing else writes.

By sub-area: ``drafts`` (the row lock, the draft, the document it would publish as: the bottom
the others share), ``lifecycle`` (create, start a draft, settings, archive), ``editing`` (a
draft's steps, session template and parameters), ``publishing``, ``files`` (import and export) and
``credentials``. The package exports their public names; what a module keeps for the package
is imported from that module."""

from __future__ import annotations

from workflows.services.credentials import (
    credential_create,
    credential_replace_value,
    credentials_reencrypt,
    vault,
)
from workflows.services.drafts import draft_canonical_data
from workflows.services.editing import (
    parameter_delete,
    parameter_save,
    session_check_save,
    session_remove,
    step_delete,
    step_duplicate,
    step_insert,
    step_move,
    step_save,
    step_target_heal,
    step_target_set,
    workflow_learn_dialog,
)
from workflows.services.errors import NotYourTeam, WorkflowError
from workflows.services.files import (
    ImportRefused,
    ImportUnchanged,
    version_export,
    workflow_import,
)
from workflows.services.lifecycle import (
    workflow_create,
    workflow_set_archived,
    workflow_start_draft,
    workflow_update_settings,
)
from workflows.services.publishing import (
    DraftReview,
    PublishKeyReused,
    PublishRefused,
    draft_review,
    workflow_publish,
    workflow_publish_once,
)

__all__ = [
    "DraftReview",
    "ImportRefused",
    "ImportUnchanged",
    "NotYourTeam",
    "PublishKeyReused",
    "PublishRefused",
    "WorkflowError",
    "credential_create",
    "credential_replace_value",
    "credentials_reencrypt",
    "draft_canonical_data",
    "draft_review",
    "parameter_delete",
    "parameter_save",
    "session_check_save",
    "session_remove",
    "step_delete",
    "step_duplicate",
    "step_insert",
    "step_move",
    "step_save",
    "step_target_heal",
    "step_target_set",
    "vault",
    "version_export",
    "workflow_create",
    "workflow_import",
    "workflow_learn_dialog",
    "workflow_publish",
    "workflow_publish_once",
    "workflow_set_archived",
    "workflow_start_draft",
    "workflow_update_settings",
]
