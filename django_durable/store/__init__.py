"""The one package that talks SQL: inserts that respect keys, row locks, claims,
fenced writes of step results, recovery and pruning.

Everything here is a short statement or a short transaction. No row lock is
held while user code runs: a claim commits before the first step starts, and
every later write of the claiming worker is fenced (``fence`` must still be the
value the claim set, and the run must still be running).
"""

from .base import *  # noqa: F403
from .children import *  # noqa: F403
from .claims import *  # noqa: F403
from .compensations import *  # noqa: F403
from .holders import *  # noqa: F403
from .pruning import *  # noqa: F403
from .runs import *  # noqa: F403
from .schedules import *  # noqa: F403
from .starts import *  # noqa: F403
from .workers import *  # noqa: F403
