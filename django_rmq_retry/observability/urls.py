"""``path("internal/", include("django_rmq_retry.observability.urls"))``: ``metrics``."""

from django.urls import path

from . import views

app_name = "django_rmq_retry_observability"
urlpatterns = [path("metrics", views.metrics, name="metrics")]
