"""Print the requirements of pyproject.toml, one per line: its build system's and its dependencies' (with the
extras named as arguments), without the project itself.

The images install these in a layer of their own, before the project's source is copied in, so that a change
to src/ rebuilds one small layer (`pip install --no-deps`) instead of downloading every dependency again.
Usage: python3 pyproject-requirements.py PYPROJECT [EXTRA ...]
"""

import sys
import tomllib

with open(sys.argv[1], "rb") as fh:
    pyproject = tomllib.load(fh)
project = pyproject["project"]
wanted = [*pyproject["build-system"]["requires"], *project["dependencies"]]
for extra in sys.argv[2:]:
    wanted += project["optional-dependencies"][extra]
print("\n".join(wanted))
