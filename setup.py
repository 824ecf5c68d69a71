"""Packaging beyond pyproject.toml: the study's notebooks/ and configs/ ship inside the wheel as package data, in
pretok_lib/_project/ (mapped from the project's own directories, not copied), so that an installed pretok
(`pip install`, not editable) runs `pretok study` from them (pretok_lib/study/home.py). Everything else about the
package is in pyproject.toml."""

from setuptools import find_packages, setup

BUNDLED = {"pretok_lib._project.notebooks": "notebooks", "pretok_lib._project.configs": "configs"}

setup(packages=[*find_packages(include=["pretok_lib*"]), *BUNDLED], package_dir=BUNDLED,
      package_data={"pretok_lib._project.notebooks": ["*.ipynb"], "pretok_lib._project.configs": ["*.yaml"]})
