"""The one package that talks SQL: inserts that respect keys, row locks, claims,
fenced writes of step results, recovery and pruning.

Everything here is a short statement or a short transaction. No row lock is
held while user code runs: a claim commits before the first step starts, and
every later write of the claiming worker is fenced (``fence`` must still be the
value the claim set, and the run must still be running).
"""

from django_durable.store.base import *  # noqa: F403
from django_durable.store.children import *  # noqa: F403
from django_durable.store.claims import *  # noqa: F403
from django_durable.store.compensations import *  # noqa: F403
from django_durable.store.holders import *  # noqa: F403
from django_durable.store.pruning import *  # noqa: F403
from django_durable.store.runs import *  # noqa: F403
from django_durable.store.schedules import *  # noqa: F403
from django_durable.store.starts import *  # noqa: F403
from django_durable.store.workers import *  # noqa: F403
