"""The signups app: its start points sqlq at the server the settings name."""

from django.apps import AppConfig
from django.conf import settings

import sqlq


class SignupsConfig(AppConfig):
    name = "signups"

    def ready(self) -> None:
        """Every client ``.send`` makes from here on goes to ``settings.SQLQ_URL`` with
        ``settings.SQLQ_TOKEN``."""
        sqlq.configure(url=settings.SQLQ_URL, token=settings.SQLQ_TOKEN)
