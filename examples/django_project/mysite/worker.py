"""What ``sqlq worker --import mysite.worker`` imports: Django set up, then the tasks.

A task that uses the ORM imports its models, which Django allows only once its apps are
loaded. The worker is not started by Django, so this module does first what
``manage.py`` and ``wsgi.py`` do (name the settings, ``django.setup()``), and only then
imports the tasks, which register themselves with sqlq. With ``sqlq worker --processes
N`` each process imports this module, so each sets Django up once.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()

import signups.tasks  # noqa: E402, F401 (registers the @task handlers; after setup)
