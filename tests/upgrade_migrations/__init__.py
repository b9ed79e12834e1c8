"""django-durable's migrations and one more: a throwaway migration of the next release
(``9000_0_4_expand_next_release``), for tests/test_upgrade_under_traffic.py. The test's
``migrate`` reads this package through ``MIGRATION_MODULES`` (tests/settings.py,
``DURABLE_TEST_MIGRATIONS``); the package's own migrations are found in their folder
(this package's path names it first), so nothing of them is copied or changed."""

from pathlib import Path

import django_durable

__path__ = [str(Path(django_durable.__file__).resolve().parent / "migrations"), *__path__]
