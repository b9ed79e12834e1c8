"""A producer process for the deployment tests: keyed starts, as a web process makes them.

    python -m tests.producer --keys 200 --seed 1

starts ``keyed_once`` once for each of the keys ``key-0`` ... ``key-199`` in an
order shuffled by ``--seed``, with the test settings (environment variables say
which database and port), and prints one JSON line: the outcome counts, the run
id each key answered with, and every error as text. Each start is its own
autocommit statement, as in a view without ``ATOMIC_REQUESTS``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections import Counter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import django_durable as durable
    from tests.testapp.workflows import KeyedOnce

    numbers = list(range(args.keys))
    random.Random(args.seed).shuffle(numbers)
    outcomes: Counter[str] = Counter()
    answered: dict[str, str] = {}
    errors: list[str] = []
    for n in numbers:
        key = f"key-{n}"
        try:
            result = durable.start_detailed(KeyedOnce, {"n": n}, key=key)
        except Exception as exc:  # counted, never hidden: the test asserts there are none
            errors.append(f"{key}: {type(exc).__name__}: {exc}")
            continue
        outcomes[result.outcome] += 1
        answered[key] = str(result.run_id)
    json.dump({"outcomes": outcomes, "answered": answered, "errors": errors}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
