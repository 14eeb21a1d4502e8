"""Logs a few fixed costs of every Python process (wall and process CPU) to $FIXEDCOST_LOG.

Put this folder on PYTHONPATH; FIXEDCOST_EXTRA adds "module:Class:function" targets
(an empty class names a module-level function)."""

import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import time

LOG = os.environ.get("FIXEDCOST_LOG")
TARGETS = {
    "octavo.model_executor.decode_graphs": [("DecodeGraphs", "capture")],
    "gguf.gguf_reader": [("GGUFReader", "__init__")],
    "octavo.model_executor.model_runner": [],
    "octavo.engine.builder": [],
}
EXTRA = os.environ.get("FIXEDCOST_EXTRA", "")
for item in filter(None, EXTRA.split(",")):
    mod, cls, fn = item.split(":")
    TARGETS.setdefault(mod, []).append((cls, fn))


def _wrap(owner, name, label):
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        w, c = time.perf_counter(), time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            rec = {
                "what": label,
                "wall": time.perf_counter() - w,
                "cpu": time.process_time() - c,
                "pid": os.getpid(),
                "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
                "argv": " ".join(sys.argv[:3])[:120],
            }
            with open(LOG, "a") as f:
                f.write(json.dumps(rec) + "\n")

    setattr(owner, name, timed)


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS or not TARGETS[fullname]:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            for cls, fn in TARGETS[fullname]:
                owner = getattr(module, cls) if cls else module
                _wrap(owner, fn, f"{fullname}.{cls}.{fn}")

        loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, Finder())


def _at_exit():
    t = os.times()
    rec = {
        "what": "process",
        "wall": time.time() - _START,
        "cpu": t.user + t.system,
        "user": t.user,
        "sys": t.system,
        "children": t.children_user + t.children_system,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": " ".join(sys.argv)[:200],
        "modules": len(sys.modules),
        "torch": "torch" in sys.modules,
    }
    try:
        with open(LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")
    except OSError:
        pass


if LOG:
    import atexit

    _START = time.time()
    atexit.register(_at_exit)
