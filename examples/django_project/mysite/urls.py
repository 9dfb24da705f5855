"""The project's routes: the signups app's."""

from django.urls import path
from signups import views

urlpatterns = [
    path("signups/", views.create, name="signup-create"),
    path("signups/<int:signup_id>/", views.detail, name="signup-detail"),
]
