"""Which packages install, and from where: the engine ``semspec`` and its subpackages, and the
service ``semjobs``, whose parts keep their top-level folders (``cli/``, ``db/``, ``jobs/``,
``worker/``, ``migrations/``: the design card's layout) and install as ``semjobs.<folder>``,
so that nothing generic (``db``, ``cli``) lands beside other packages. Everything else is in
pyproject.toml."""

from setuptools import find_namespace_packages, setup

SERVICE_FOLDERS = ("cli", "db", "jobs", "worker", "migrations")

packages = find_namespace_packages(include=["semjobs", "semspec", "semspec.*"])
package_dir = {}
for folder in SERVICE_FOLDERS:
    package_dir[f"semjobs.{folder}"] = folder
    packages += [f"semjobs.{folder}", *(f"semjobs.{folder}.{sub}" for sub in find_namespace_packages(where=folder))]

setup(packages=packages, package_dir=package_dir)
