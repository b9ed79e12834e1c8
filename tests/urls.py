from django.contrib import admin
from django.urls import include, path

from tests import async_views, stream_views

urlpatterns = [
    path("admin/durable/", include("django_durable.urls")),
    path("admin/", admin.site.urls),
    path("async/start/", async_views.start),
    path("streams/<uuid:run_id>/<str:name>/", stream_views.stream),
    path("astreams/<uuid:run_id>/<str:name>/", stream_views.astream),
    path("async/runs/<uuid:run_id>/", async_views.run),
    path("async/runs/<uuid:run_id>/<str:action>/", async_views.act),
]
