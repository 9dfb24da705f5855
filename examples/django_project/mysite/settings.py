"""The project's settings: one app (``signups``), SQLite, and where sqlq is.

The database file is ``SIGNUPS_DB`` (default ``db.sqlite3`` here); the web process and
the ``sqlq worker`` process both open it, so both must be given the same one. sqlq's
server and token are ``SQLQ_URL`` and ``SQLQ_TOKEN``, read here so that Django's settings
stay the one place the project is configured (``signups.apps`` hands them to
``sqlq.configure``).
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-an-example-only")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = ["signups"]
# No sessions or cookie logins, so no CSRF middleware: the one POST is an API call. In a
# project with logins, keep CsrfViewMiddleware and post with the token as usual.
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "mysite.urls"
WSGI_APPLICATION = "mysite.wsgi.application"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SIGNUPS_DB", str(BASE_DIR / "db.sqlite3")),
        # Two processes write it (the web app and the worker): wait for the other's lock.
        "OPTIONS": {"timeout": 20},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

SQLQ_URL = os.environ.get("SQLQ_URL", "http://127.0.0.1:8080")
SQLQ_TOKEN = os.environ.get("SQLQ_TOKEN") or None
