"""A signup, and when its welcome mail went out (the job's one write)."""

from django.db import models


class Signup(models.Model):
    email = models.EmailField()
    created_at = models.DateTimeField(auto_now_add=True)
    job_id = models.CharField(max_length=32, blank=True)  # the welcome job, to ask about it
    welcomed_at = models.DateTimeField(null=True, blank=True)  # set by the job

    def __str__(self) -> str:
        return str(self.email)
