"""A file of the repository (an example, a script) loaded as a module, for the tests
that check it where it lies, without installing it."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]


def load(relative, name):
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
