"""The ``memsnap`` console script: the same command line as the binary, run in this process
(output, exit status and all)."""

from __future__ import annotations

import signal
import sys

from memsnap import _native


def main() -> None:
    """Run ``memsnap ARGS...`` and exit with its status.

    Ctrl-C ends the process at once, as it ends the binary (killed by SIGINT, status 130 in a
    shell): Python's own handler would wait for the command to finish first. A SIGINT this
    process was started with ignored (a background job of a script) stays ignored, as for the
    binary.
    """
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(_native.run(["memsnap", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
