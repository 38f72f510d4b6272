"""What the disk said: the OS error under a failed save or write (orbax and the metrics writer wrap it), in one line.

A full disk, a quota, a read-only or unwritable path ends a run with exit 1 and one line naming the path and the
OS's error; anything else that fails keeps its traceback (it is a bug). Imports no JAX (the command line uses it).
"""

import errno
import os
import re

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                            errno.EFBIG})


# TensorStore (under orbax) reports the OS's error in its message: '... local file "PATH" ... [os_error_code='28']'.
_TENSORSTORE = re.compile(r"""local file "([^"]+)".*\[os_error_code='(\d+)'\]""", re.DOTALL)


class StorageFailure(SystemExit):
  """The run stopped on a storage error; its one line is printed (exit 1)."""


def os_error_in(error: BaseException) -> OSError | None:
  """The storage OSError that `error` is or was raised from (its causes, contexts and grouped errors, and TensorStore's
  error messages), or None; one that names its file is preferred."""
  seen, todo, found = set(), [error], []
  while todo:
    e = todo.pop(0)
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
      found.append(e)
    elif (match := _TENSORSTORE.search(str(e))) and int(match.group(2)) in STORAGE_ERRNOS:
      code = int(match.group(2))
      found.append(OSError(code, os.strerror(code), match.group(1)))
    todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
  return next((e for e in found if e.filename), found[0] if found else None)


def describe(error: OSError) -> str:
  """'PATH: No space left on device (ENOSPC); ...': the path, the OS's words and what to do."""
  path = error.filename or "a file of the run"
  code = errno.errorcode.get(error.errno, str(error.errno))
  reason = error.strerror or os.strerror(error.errno or 0)
  return (f"{path}: {reason} ({code}); the run stopped, its last sound checkpoint is kept: free the space or fix "
          "the path, then run the same command to resume")
