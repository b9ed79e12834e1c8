"""Check what `make dist` built: DIR holds one sdist and one wheel of the version
pyproject.toml names, the wheel holds the package alone (no tests, bench or example
project) with its templates, static files and SQL, and the sdist holds what building
that wheel needs (the package, pyproject.toml, the README and the license) and no
test suite. Exit 1, naming each problem, when something is off.

    python scripts/check-dist.py DIR
"""

import pathlib
import sys
import tarfile
import tomllib
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Beside the package (and setuptools' egg-info), only these may be in the sdist.
SDIST_TOP = {"pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "PKG-INFO", "setup.cfg"}


def package_data() -> set[str]:
    """The files of the package that aren't Python source: every one must ship."""
    package = ROOT / "django_durable"
    return {
        path.relative_to(ROOT).as_posix()
        for folder in ("templates", "static", "migrations/sql")
        for path in (package / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    } | {"django_durable/py.typed"}


def problems(folder: pathlib.Path) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    stem = f"{project['name'].replace('-', '_')}-{project['version']}"
    wheels, sdists = sorted(folder.glob("*.whl")), sorted(folder.glob("*.tar.gz"))
    found = [p.name for p in wheels + sdists]
    if found != [f"{stem}-py3-none-any.whl", f"{stem}.tar.gz"]:
        return [f"expected one wheel and one sdist of {stem} in {folder}, found {found}"]
    wrong = []
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    for name in sorted(names):
        if not name.startswith(("django_durable/", f"{stem}.dist-info/")):
            wrong.append(f"wheel: {name} is not the package's")
    wrong += [f"wheel: {name} is missing" for name in sorted(package_data() - names)]
    with tarfile.open(sdists[0]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if m.isfile()}
    for name in sorted(members):
        top = name.split("/", 1)[0]
        allowed = top in ("django_durable", f"{stem.split('-')[0]}.egg-info")
        if not (name in SDIST_TOP if "/" not in name else allowed):
            wrong.append(f"sdist: {name} has no place in it")
    needed = {"pyproject.toml", "README.md", "LICENSE", *package_data()}
    wrong += [f"sdist: {name} is missing" for name in sorted(needed - members)]
    return wrong


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    found = problems(pathlib.Path(sys.argv[1]))
    for problem in found:
        print(f"check-dist: {problem}", file=sys.stderr)
    if found:
        sys.exit(1)
    print(f"check-dist: the sdist and the wheel in {sys.argv[1]} hold what they should")
