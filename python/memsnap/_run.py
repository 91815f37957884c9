"""Running memsnap's command line in this process (``memsnap._native``), naming inputs for it,
and turning its exit status and error line into Python's terms."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import IO, Dict, List, Optional, Union

from memsnap import _native

#: What the API reads a snapshot from: a path, the snapshot's bytes (compressed or not), or a
#: file opened in binary mode.
Source = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, IO[bytes]]

#: The program name the command line is run under (what ``--help`` and errors call it).
PROGRAM = "memsnap"

#: How the command line starts the line that says why an input cannot be read.
ERROR_PREFIX = "memsnap: error: "

#: The name bytes are handed to the command line under, and that its errors call them.
BYTES_NAME = "<bytes>"


class SnapshotError(Exception):
    """What the command line stopped at with exit status 2 and its error line: an input it
    cannot read (and the few arguments it checks itself, such as an unknown ``fail_on`` kind).

    ``str(error)`` is the command line's one-line error without its ``memsnap: error: ``
    prefix, word for word: for an input, its name (the path, or ``<bytes>`` for bytes), then
    what and where (byte offset and opcode, or key path). ``stderr`` is all the command wrote
    there.
    """

    def __init__(self, message: str, *, stderr: str = "", code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.stderr = stderr
        self.code = code


@dataclass(frozen=True)
class Output:
    """What one run of the command line wrote, and its exit status."""

    code: int
    stdout: str
    stderr: str


def run(args: List[str], inputs: Optional[Dict[str, bytes]] = None) -> Output:
    """Run ``memsnap ARGS...`` captured; ``inputs`` maps names used in ``args`` to bytes."""
    code, out, err = _native.run_captured([PROGRAM, *args], inputs or {})
    return Output(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def error_line(stderr: str) -> Optional[str]:
    """The last ``memsnap: error:`` line of ``stderr``, without the prefix."""
    lines = [line for line in stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    return lines[-1][len(ERROR_PREFIX) :] if lines else None


def raise_for_error(result: Output) -> None:
    """Raise :class:`SnapshotError` when the run stopped at an input it could not read, and
    ``ValueError`` when it did not accept its command line (an option value the API passed
    on, such as a size it cannot parse)."""
    message = error_line(result.stderr)
    if message is not None:
        raise SnapshotError(message, stderr=result.stderr, code=result.code)
    if result.code == 2:
        # clap's own words: "error: invalid value ..." and a usage hint.
        raise ValueError(result.stderr.strip() or "memsnap: exit status 2")
    if result.code not in (0, 1):
        raise RuntimeError(f"memsnap exited with status {result.code}: {result.stderr.strip()}")


def run_checked(args: List[str], inputs: Optional[Dict[str, bytes]] = None) -> Output:
    """:func:`run`, raising as :func:`raise_for_error` says on an error."""
    result = run(args, inputs)
    raise_for_error(result)
    return result


@dataclass(frozen=True)
class Input:
    """A source as the command line reads it: the argument naming it, and the bytes handed
    over under that name (``None`` for a file the command opens itself)."""

    arg: str
    data: Optional[bytes] = field(default=None, repr=False)

    def inputs(self) -> Dict[str, bytes]:
        return {} if self.data is None else {self.arg: self.data}


def _same_file(f: IO[bytes], path: str) -> bool:
    """Whether the open file ``f`` is the file at ``path``, read from its start."""
    try:
        if not f.seekable() or f.tell() != 0:
            return False
        a, b = os.fstat(f.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def resolve(source: Source, bytes_name: str = BYTES_NAME) -> Input:
    """How the command line reads ``source``: a path as it is; bytes (and a file read whole)
    under ``bytes_name``. A file opened from a path on disk, not read yet, is read by its path,
    so that errors and the JSON's ``file`` name it as for the path."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return Input(bytes_name, bytes(source))
    if isinstance(source, (str, os.PathLike)):
        return Input(os.fsdecode(os.fspath(source)))
    read = getattr(source, "read", None)
    if read is None:
        raise TypeError(
            "a snapshot is a path, bytes, or a file opened in binary mode, "
            f"not {type(source).__name__}"
        )
    name = getattr(source, "name", None)
    if isinstance(name, str) and _same_file(source, name):
        return Input(name)
    data = read()
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError("the snapshot file is open in text mode: open it with 'rb'")
    return Input(bytes_name, bytes(data))
