from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/durable/", include("django_durable.urls")),
    path("admin/", admin.site.urls),
]
