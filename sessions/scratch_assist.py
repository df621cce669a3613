"""A model's help in a scratch session, off unless one is configured: finding the element a
person describes on the page, and drafting the steps toward a goal on it.

Both are proposals. The model reads the page's numbered elements (roles and names, with the
parameters' defaults put back as the references that name them) and the names of the
parameters and credential fields; never a value typed, never a secret. It answers with numbers
from that menu only; the targets are the observation's own roles and names. A described element
is then picked like any other; drafted steps join the draft only when the person adds them.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from pandaweb.assist import prompts
from pandaweb.assist.models import ModelCall
from pandaweb.assist.services import model_call_request
from sessions.engine.steps.language import Target
from sessions.engine.vocabulary import MASK
from sessions.models import ScratchSession
from sessions.services import scratch
from workflows import selectors as workflow_selectors
from workflows import services as workflow_services
from workflows.schema import STEP_ADAPTER, describe_step


def scratch_assist_ask(
    *, scratch_id: int, user: User, purpose: ModelCall.Purpose, words: str
) -> ModelCall:
    """Ask the configured model about the page as last seen: which element ``words`` describes
    (CHOOSE), or the steps toward the goal ``words`` (DRAFT). Raises ScratchError or
    ``ModelUnavailable`` in people's words."""
    session = scratch.scratch_get(scratch_id=scratch_id, user=user)
    words = " ".join(words.split())[:300]
    if not words:
        raise scratch.ScratchError("say what you mean first")
    if not session.is_open:
        raise scratch.ScratchError("this scratch session has ended: open a new one")
    elements = (session.observation or {}).get("elements") or []
    if not elements:
        raise scratch.ScratchError("nothing is seen yet: run a step or look at the page first")
    values = _values(session)
    if purpose == ModelCall.Purpose.CHOOSE:
        prompt, offered = prompts.choosing_prompt(
            description=words, elements=elements, run_values=values
        )
    else:
        prompt, offered = prompts.drafting_prompt(
            goal=words,
            elements=elements,
            parameters=_parameters(session),
            credential_fields=_credential_fields(session),
            run_values=values,
        )
    return model_call_request(
        user=user,
        scratch_id=session.pk,
        # The page the question is about: an answer is read against it only.
        target_field=session.picture,
        purpose=purpose,
        description=words,
        prompt=prompt,
        offered=offered,
    )


def scratch_assist_latest(session: ScratchSession, user: User) -> ModelCall | None:
    return session.model_calls.filter(requested_by=user).order_by("-pk").first()


def scratch_assist_chosen(session: ScratchSession, call: ModelCall) -> dict[str, Any] | None:
    """The element of the page the model chose for a description (None: none, or the page
    changed since the question)."""
    if call.purpose != ModelCall.Purpose.CHOOSE or not _same_page(session, call):
        return None
    number = prompts.choosing_read(call.answer, call.offered)
    return _element(session, number) if number is not None else None


def scratch_assist_drafted(session: ScratchSession, call: ModelCall) -> list[dict[str, Any]]:
    """The steps the model proposed toward the goal, as steps of the draft (ids, targets from
    the page's own roles and names), each with its sentence: ``{"step", "sentence"}``."""
    if call.purpose != ModelCall.Purpose.DRAFT or not _same_page(session, call):
        return []
    taken: set[str] = set()
    drafted = []
    for entry in prompts.drafting_read(
        call.answer, call.offered, _parameters(session), _credential_fields(session)
    ):
        element = _element(session, int(entry["element"]))
        if element is None or not element.get("role") or not element.get("name"):
            continue
        kind = str(entry["do"])
        step: dict[str, Any] = {
            "id": scratch.new_step_id(session.workflow, kind, str(element["name"]), taken),
            "type": kind,
            "target": Target(role=element["role"], name=element["name"], exact=True).model_dump(
                exclude_defaults=True
            ),
        }
        if kind in ("fill", "select"):
            if element.get("value") == MASK and not str(entry["value"]).startswith("{{ secrets."):
                # A field whose content the page masks takes a secret: from a credential only.
                continue
            step["value" if kind == "fill" else "option"] = entry["value"]
        try:
            validated = STEP_ADAPTER.validate_python(step)
        except ValueError:
            continue
        taken.add(step["id"])
        drafted.append({"step": step, "sentence": describe_step(validated)})
    return drafted


def scratch_assist_add(*, scratch_id: int, user: User, call_id: int, after: str = "") -> list[str]:
    """Add the steps the model drafted (model call ``call_id``) to the draft, in order, after
    step ``after``; returns their ids. Raises ScratchError or ``workflow_services.WorkflowError``
    in people's words."""
    session = scratch.scratch_get(scratch_id=scratch_id, user=user)
    added: list[str] = []
    with transaction.atomic():
        # Locked: a second click waits, then finds the steps added already.
        call = (
            ModelCall.objects.select_for_update()
            .filter(pk=call_id, scratch=session, requested_by=user)
            .first()
        )
        if call is not None and call.status == ModelCall.Status.ADDED:
            raise scratch.ScratchError("those steps are in the draft already")
        drafted = scratch_assist_drafted(session, call) if call is not None else []
        if call is None or not drafted:
            raise scratch.ScratchError("those steps are gone: ask again on the page as it is now")
        _add(session, user, call, drafted, after, added)
        call.status = ModelCall.Status.ADDED
        call.save(update_fields=["status"])
    return added


def _add(
    session: ScratchSession,
    user: User,
    call: ModelCall,
    drafted: list[dict[str, Any]],
    after: str,
    added: list[str],
) -> None:
    note = (
        f"drafted by the model {call.model_name} toward '{call.description}' in scratch "
        f"session #{session.pk}, added by {user.get_username()}"
    )
    for entry in drafted:
        workflow_services.step_insert(
            workflow_id=session.workflow_id,
            user=user,
            data=entry["step"],
            after=after,
            note=note[:500],
        )
        after = entry["step"]["id"]
        added.append(after)


def _same_page(session: ScratchSession, call: ModelCall) -> bool:
    return (
        call.status == ModelCall.Status.ANSWERED
        and bool(call.answer)
        and call.target_field == session.picture
    )


def _element(session: ScratchSession, number: int) -> dict[str, Any] | None:
    elements = (session.observation or {}).get("elements") or []
    return next((dict(e) for e in elements if e.get("number") == number), None)


def _values(session: ScratchSession) -> dict[str, str]:
    return {
        f"{{{{ params.{name} }}}}": str(value)
        for name, value in scratch.scratch_inputs(session.workflow).items()
    }


def _parameters(session: ScratchSession) -> list[str]:
    version = workflow_selectors.working_copy(session.workflow)
    return [str(p["name"]) for p in (version.parameters if version is not None else [])]


def _credential_fields(session: ScratchSession) -> list[str]:
    return scratch.scratch_credential_fields(session.workflow)
