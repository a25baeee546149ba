"""The trainer's heap: keep the pages it frees (glibc malloc).

With glibc's defaults a train step's large tensors (the LM head's rows x 49k
vocabulary, the MLP's activations) are mmap'd fresh and unmapped when freed, and
a worker thread's arena hands memory back too: every step faults in and zeroes
~1.4 GB of new pages (~350k minor faults per quickstart step on CPU, measured).
One arena, no mmap for large blocks and no trimming make a step reuse the pages
of the last one; the process's RSS stays at its peak instead of dipping between
steps. Nothing computed changes (the update is bitwise the same)."""

from __future__ import annotations

import ctypes
import platform
import resource
from dataclasses import dataclass

# glibc reads these at process start (a trainer worker's environment).
KEEP_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
}
# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_INT_MAX = 2**31 - 1


def keep_freed_pages() -> bool:
    """The same settings in this process (the in-process trainer). Threads that
    already allocated keep their arenas, so call it before starting threads.
    False where the C library is not glibc (nothing is changed there)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_ARENA_MAX, 1),
            (_M_MMAP_MAX, 0),
            (_M_TRIM_THRESHOLD, _INT_MAX),
        )
    )


def keep_freed_pages_if_asked(argv: list[str]) -> bool:
    """``keep_freed_pages`` for a process about to host a trainer, read from its
    command line (``--config X.yaml [key=value ...]``) before anything else:
    importing torch and AReaL starts threads, and a thread that allocated keeps
    its own arena. A command line that does not parse is left to load_config,
    which reports it. True when the heap now keeps freed pages."""
    from omegaconf import OmegaConf

    from areal_marlaas.config.loader import compose_yaml, parse_args

    key = "keep_freed_pages"
    try:
        args = parse_args(argv)
        # The field alone, typed as the config types it (no/off/0 are false).
        field = OmegaConf.structured(_KeepFreedPages)
        yaml = compose_yaml(args.config)
        if key in yaml:
            field[key] = yaml[key]
        sets = [o.lstrip("+") for o in args.overrides]
        field.merge_with_dotlist([o for o in sets if o.startswith(f"{key}=")])
    except Exception:
        return False
    return field[key] and keep_freed_pages()


@dataclass
class _KeepFreedPages:
    keep_freed_pages: bool = True


def page_faults() -> int:
    """Minor page faults of this process so far (fresh pages touched)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
