"""One engine per database: ``postgres`` and ``sqlite``, each a module holding every
statement the store runs on that database (one literal each, with a comment on what
it does and which index serves it), what that database does (``SERVER_CLOCK``,
``SERIALISES_WRITERS``, ...) and how its parameters go.

Both engines name the same statements; one that a database does without is ``None``
there, and the store does the same through the ORM. The engine is chosen here, once
per connection alias, from the connection's vendor: the only place in the package
that asks which database it is (``store.base.engine`` is how the store asks for it).
"""

from __future__ import annotations

from types import ModuleType

from django_durable.store.engines import postgres, sqlite

__all__ = ["ENGINES", "for_connection"]

# Every engine, for the tests that check both agree on what they name.
ENGINES: tuple[ModuleType, ...] = (postgres, sqlite)

# The engine of each alias, chosen at its first use.
_chosen: dict[str, ModuleType] = {}


def for_connection(connection) -> ModuleType:
    """The engine of ``connection``'s database (chosen at the alias's first use):
    PostgreSQL's for PostgreSQL, SQLite's otherwise."""
    try:
        return _chosen[connection.alias]
    except KeyError:
        chosen = postgres if connection.vendor == "postgresql" else sqlite
        _chosen[connection.alias] = chosen
        return chosen
