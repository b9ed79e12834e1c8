"""The dashboard's URLs. Include them under the admin, before the admin's own:
``path("admin/durable/", include("django_durable.urls"))``.

The pages are served by the admin site that registered ``Run`` (its login page,
chrome and sidebar): ``admin.site``, or the project's own site where it
registered ``django_durable.admin.RunAdmin`` (see docs/dashboard.md for a site
of your own: ``include(my_site.get_model_admin(Run).dashboard_urls())``).
"""

from django_durable.admin import dashboard_admin
from django_durable.dashboard.urls import APP_NAME, patterns

app_name = APP_NAME

urlpatterns = patterns(dashboard_admin())
