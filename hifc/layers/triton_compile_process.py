"""Triton kernel variants compiled in processes of their own, into Triton's file cache.

A start-up's deferred variants (``hifc.layers.triton_jit``) compile side by side. In threads,
each compilation's Python part (the kernel's code generation) holds the process's GIL, and so
holds up the start-up work the calling thread does meanwhile (timing the GEMMs). Here a variant
compiles in a child process instead: ``CompileProcesses`` starts ``python -m
hifc.layers.triton_compile_process`` children with this process's environment and import path,
each importing the kernels' modules once (the first at its start, while the caller's pass goes
on; others when a variant needs them), and hands them variants one at a time (a JSON line each
way). A child compiles the variant for this process's device target, without a device of
its own, and Triton stores it in its file cache, where this process's own compilation of the
variant then finds it. A variant's job fails (and this process compiles it as before) when the
child finds another source for the kernel, its compilation fails, or the child dies.

Only kernels defined at a module's top level can be found by a child (``importable``).
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future

log = logging.getLogger(__name__)


def importable(function) -> tuple[str, str] | None:
    """(module, qualified name) by which a child process finds ``function``: a Triton
    JITFunction defined at its module's top level; None for anything else."""
    from triton.runtime import JITFunction
    if not isinstance(function, JITFunction):
        return None
    name = function.fn.__qualname__
    return None if "<locals>" in name else (function.module, name)


class CompileProcesses:
    """``count`` child processes compiling kernel variants for this process's device target;
    one thread per child feeds it jobs from a shared queue."""

    def __init__(self, children: list[subprocess.Popen]):
        self.count = len(children)
        self._jobs: queue.Queue = queue.Queue()
        self._children = children
        self._feeders = [threading.Thread(target=self._feed, args=(child,), daemon=True,
                                          name=f"hifc-compile-{index}")
                         for index, child in enumerate(children)]
        for feeder in self._feeders:
            feeder.start()

    @classmethod
    def start(cls, count: int, modules: list[str]) -> CompileProcesses | None:
        """Start ``count`` children that import ``modules`` (the kernels' own) and compile for
        the active Triton driver's target; None (logged) where they cannot start."""
        from triton.runtime.driver import driver
        target = driver.active.get_current_target()
        # this process's import path: a child finds the same modules, whatever put them there
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
        command = [sys.executable, "-m", __name__, json.dumps(
            [target.backend, target.arch, target.warp_size]), *modules]
        children: list[subprocess.Popen] = []
        try:
            for _ in range(count):
                children.append(subprocess.Popen(command, stdin=subprocess.PIPE,
                                                 stdout=subprocess.PIPE, env=env, text=True))
        except OSError as exc:
            for child in children:
                child.kill()
            log.info("kernel variants compile in threads: no compile processes (%s)", exc)
            return None
        return cls(children)

    def submit(self, source: tuple[str, str], cache_key: str, data: str) -> Future:
        """A child's compilation of the variant ``data`` (Triton's specialisation data) of the
        kernel at ``source`` (``importable``'s) whose source hash is ``cache_key``; its result
        is None once the variant is in Triton's file cache, and it raises otherwise."""
        future: Future = Future()
        self._jobs.put((json.dumps({"module": source[0], "name": source[1],
                                    "cache_key": cache_key, "data": data}), future))
        return future

    def _feed(self, child: subprocess.Popen) -> None:
        alive = True
        while (job := self._jobs.get()) is not None:
            line, future = job
            if not future.set_running_or_notify_cancel():
                continue
            error = f"compile process {child.pid} ended"
            if alive:
                try:
                    child.stdin.write(line + "\n")
                    child.stdin.flush()
                    reply = child.stdout.readline()
                    error = json.loads(reply).get("error") if reply else error
                    alive = bool(reply)
                except (OSError, ValueError, AttributeError) as exc:  # broken pipe, garbled reply
                    error, alive = f"compile process {child.pid}: {exc}", False
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(RuntimeError(error))

    def close(self) -> None:
        """End the children once the jobs submitted are done (the queue hands out every job
        before the feeders' end marks, which follow them)."""
        for _ in self._feeders:
            self._jobs.put(None)
        for feeder in self._feeders:
            feeder.join()
        for child in self._children:
            try:
                child.stdin.close()
            except OSError:
                pass
            child.wait()


class TargetDriver:
    """Triton's active driver in a compile process: the parent's device target and no device
    (what ``JITFunction.preload`` asks of a driver to compile a variant)."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0


def compile_variant(module: str, name: str, cache_key: str, data: str) -> None:
    """Compile the variant ``data`` of the kernel ``name`` in ``module`` (through Triton's
    ``preload``, which stores it in the file cache) under the active driver's target; refuse a
    kernel whose source hash is not ``cache_key`` (the caller's)."""
    from triton.runtime import JITFunction
    function = importlib.import_module(module)
    for part in name.split("."):
        function = getattr(function, part)
    while not isinstance(function, JITFunction) and hasattr(function, "fn"):
        function = function.fn  # a kernel wrapped by Triton's autotuner or heuristics
    if not isinstance(function, JITFunction) or function.cache_key != cache_key:
        raise RuntimeError(f"{module}.{name} here is not the caller's kernel")
    function.preload(data)


def main(argv: list[str]) -> int:
    """A compile process: ``argv`` is the target (JSON: backend, arch, warp size), then the
    modules to import first. Reads a job per line on stdin and answers each with a line on
    stdout; anything else written to stdout (by Triton or its compilers) goes to stderr."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    driver.set_active(TargetDriver(GPUTarget(*json.loads(argv[0]))))
    for module in argv[1:]:
        importlib.import_module(module)
    for line in sys.stdin:
        job = json.loads(line)
        try:
            compile_variant(job["module"], job["name"], job["cache_key"], job["data"])
            reply = {}
        except Exception as exc:  # noqa: BLE001 (reported to the parent, which compiles)
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # every reply is written: no interpreter teardown to wait for
