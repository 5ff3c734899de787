"""The root of every error a user can cause, and the two that every package raises.

Every error a user can cause derives from :class:`SpecstoreError`, whose
``str()`` is a one-line explanation naming the path or value at fault.  Each
package gathers its own subclasses in its ``errors`` module
(``specstore.store.errors``, ...); :func:`specstore.common.cli.run_cli`
prints any of them as one line, ``specstore: error: <message>``, and exits 2.
"""

from __future__ import annotations

__all__ = ["ConfigError", "ExecutorError", "OutputPathError", "SpecstoreError", "TaskLost", "worker_message"]


def worker_message(message: str) -> str:
    """``message``, or the original one when it is torch's report of an error raised in a DataLoader worker.

    torch raises a worker's error again in the parent as ``type(err)(text)``, where ``text`` is "Caught X in
    DataLoader worker process 0.", then the worker's traceback, whose last line is ``module.X: <original>``.
    """
    lines = [line for line in message.strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Caught ") and " worker process " in lines[0] and ": " in lines[-1]:
        return lines[-1].split(": ", 1)[1]
    return message


class SpecstoreError(Exception):
    """Root of every user-facing error in the project; ``str(err)`` is one line.

    Raised in a DataLoader worker and raised again in the parent by torch, it keeps its own one-line message
    (:func:`worker_message`), so a command still prints the cause, not "Caught ... in DataLoader worker".
    """

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):
            args = (worker_message(args[0]), *args[1:])
        super().__init__(*args)


class ConfigError(SpecstoreError, ValueError):
    """A bad option, setting or spec value (caught before any work starts where possible)."""


class OutputPathError(SpecstoreError, ValueError):
    """An output path cannot be written: a directory, under a file, a socket or block device, a closed descriptor."""


class ExecutorError(SpecstoreError, RuntimeError):
    """Where tasks should run cannot be had: a cluster's library is missing, its scheduler cannot be reached, or
    a local one cannot start (:mod:`specstore.common.executors`)."""


class TaskLost(ExecutorError):
    """A task that never finished because the processes running it were lost (killed, out of memory, a node
    gone) as often as the cluster reruns such a task, or because a local pool broke under it.

    One line: the task's key, where it ran, the cluster's error (kept as ``__cause__``).  A driver stops on
    it after committing what has finished; a rerun resumes.
    """

    def __init__(self, key: str, where: str, cause: BaseException) -> None:
        lines = str(cause).strip().splitlines()
        detail = f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__
        super().__init__(f"task {key} was lost on {where} ({detail})")
        self.key = key
        self.__cause__ = cause
