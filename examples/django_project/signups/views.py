"""Signing up sends the welcome job; a signup's page shows the row and the job's state."""

from functools import cache

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET, require_POST

from sqlq import Client, NotFound

from .models import Signup
from .tasks import welcome


@cache
def queue() -> Client:
    """This process's client for reading jobs, made at first use (after ``sqlq.configure``
    ran, in ``SignupsConfig.ready``) and shared by the server's threads, as httpx's is."""
    return Client()


@require_POST
def create(request: HttpRequest) -> HttpResponse:
    """``POST email=...``: the row, then the job (201 with both ids).

    The row is committed before the job is sent (autocommit), so the worker finds it. Inside
    ``transaction.atomic()``, send from ``transaction.on_commit(...)`` instead: a job sent
    before its row commits may run before the row exists (or for a row rolled back)."""
    email = request.POST.get("email", "")
    if "@" not in email:
        return JsonResponse({"error": "email: required"}, status=400)
    signup = Signup.objects.create(email=email)
    handle = welcome.send(signup_id=signup.pk)
    signup.job_id = handle.id
    signup.save(update_fields=["job_id"])
    return JsonResponse({"signup": signup.pk, "job": handle.id}, status=201)


@require_GET
def detail(request: HttpRequest, signup_id: int) -> HttpResponse:
    """The row, and its job as the queue has it (``sqlq.configure``'s server and token);
    ``"job": null`` once the server no longer keeps it (``sqlq serve --retention``, an hour
    after it finished), when the row is what is left of it."""
    signup = get_object_or_404(Signup, pk=signup_id)
    job = None
    if signup.job_id:  # (empty if the send failed after the row was made)
        try:
            found = queue().get(signup.job_id)
            job = {"id": found.id, "state": found.state.value, "result": found.result}
        except NotFound:
            pass
    # The row again, after the job: the worker's write commits before it reports the job
    # completed, so only a row read after the job shows what a completed job wrote.
    signup.refresh_from_db(fields=["welcomed_at"])
    welcomed = signup.welcomed_at.isoformat() if signup.welcomed_at else None
    return JsonResponse({"email": signup.email, "welcomed_at": welcomed, "job": job})
