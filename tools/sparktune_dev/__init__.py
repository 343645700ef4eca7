"""Tools for working on this repository (the embedded runner, the native stack, demo data, the run
summary): not part of the shipped packages, importable from the project's virtual environment."""
