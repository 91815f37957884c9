"""Types of the extension module (crates/memsnap-python): memsnap's command line in-process.
``argv[0]`` is the program name; ``inputs`` maps input names used in ``argv`` to their bytes."""

from typing import Dict, List, Tuple

def run(argv: List[str]) -> int: ...
def run_captured(argv: List[str], inputs: Dict[str, bytes] = ...) -> Tuple[int, bytes, bytes]: ...
