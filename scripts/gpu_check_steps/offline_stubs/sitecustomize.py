"""Offline GPU check only: stand-ins for heavy packages AReaL imports at module load
but never calls in a single-process FSDP trainer (ray, wandb, swanlab, trackio).

Active only when ``MARLAAS_GPU_CHECK_STUBS`` names them (comma list) and only for a
package that is really missing: an installed one is always used. A stand-in module
hands out stand-in classes for any attribute; calling one returns a falsy stand-in,
so import-time decorators and ``isinstance``/``except`` clauses work, and anything
that would really need the package does nothing useful. ``GPU_CHECK_STUBBED`` in the
environment of child processes and ``sys.modules[name].__gpu_check_stub__`` say which
were used; the GPU check records them. After installing itself this module runs the
next ``sitecustomize`` on ``sys.path``, if any.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

_NAMES = {n for n in os.environ.get("MARLAAS_GPU_CHECK_STUBS", "").split(",") if n}
STUBBED = []


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__qualname__}.{name}")

    def __bool__(cls):
        return False


class _Stub(Exception, metaclass=_StubMeta):
    """Stand-in for any class, function or object of a stubbed package."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _stub_class(f"{type(self).__qualname__}()")()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{type(self).__qualname__}.{name}")()

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())


def _stub_class(qualname):
    cls = _StubMeta(qualname.rsplit(".", 1)[-1], (_Stub,), {})
    cls.__qualname__ = qualname
    return cls


class _StubModule(types.ModuleType):
    __gpu_check_stub__ = True

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{self.__name__}.{name}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []  # a package: submodules come here too
        return mod

    def exec_module(self, module):
        top = module.__name__.split(".")[0]
        if top not in STUBBED:
            STUBBED.append(top)
            os.environ["GPU_CHECK_STUBBED"] = ",".join(STUBBED)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in _NAMES:
            return None
        if name == top and importlib.machinery.PathFinder.find_spec(top) is not None:
            return None  # really installed: use it
        if name != top and not isinstance(sys.modules.get(top), _StubModule):
            return None
        return importlib.util.spec_from_loader(name, _Loader(), is_package=True)


if _NAMES:
    sys.meta_path.append(_Finder())


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        cand = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(cand):
            with open(cand) as f:
                code = compile(f.read(), cand, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": cand})
            return


_chain()
