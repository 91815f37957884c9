"""Analyse an archive of PyTorch memory snapshots with Ray Data, one row per snapshot.

    python examples/ray_archive.py OUT_DIR PATH... [--num-cpus N] [--memory-per-task SIZE] [--blocks N]

Each PATH is a snapshot file or a directory (walked for ``*.pickle``/``*.pkl``, optionally
compressed, as ``memsnap batch`` selects them). The rows are those of ``memsnap batch PATH...``
(schema_version 1, docs/batch.md), computed by ``memsnap.row`` in Ray tasks and written to
OUT_DIR as Parquet files, all with the schema :data:`ROW_SCHEMA` (see :func:`rows_table` for
why the types are given rather than inferred).

Without a running cluster, ``ray.init`` starts a local one (``--num-cpus``). On a cluster, run
it on the head node (or with ``RAY_ADDRESS`` set); every node needs memsnap installed (or a
``runtime_env`` that installs it) and the PATHs readable where the tasks run; for object
storage see docs/archives.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

import pyarrow as pa

import memsnap

#: Names a directory walk reads, as ``memsnap batch`` does (docs/batch.md, "Which files are
#: read"): ``*.pickle`` or ``*.pkl``, optionally ``.gz``/``.gzip``/``.zst``/``.zstd``/``.xz``,
#: case-insensitive; names starting with ``.`` are skipped.
_SNAPSHOT_ENDINGS = tuple(
    base + comp for base in (".pickle", ".pkl") for comp in ("", ".gz", ".gzip", ".zst", ".zstd", ".xz")
)

_SITE = pa.struct([("filename", pa.string()), ("function", pa.string()), ("line", pa.int64())])

#: The Parquet columns of a ``memsnap batch`` row (schema_version 1), keys in the rows' own
#: (alphabetical) order. Byte counts are uint64: memsnap holds a total that would pass
#: 2**64 - 1 at that value (with a caveat), which int64 cannot store. A field that does not
#: apply, and every figure of an error row, is null.
ROW_SCHEMA = pa.schema(
    [
        ("allocated_bytes", pa.uint64()),
        ("caveats", pa.list_(pa.string())),
        ("compression", pa.string()),
        ("devices", pa.list_(pa.int64())),
        ("error", pa.string()),
        ("file_bytes", pa.uint64()),
        ("path", pa.string()),
        ("peak_allocated_bytes", pa.uint64()),
        ("peak_device", pa.int64()),
        ("peak_reserved_bytes", pa.uint64()),
        (
            "per_device",
            pa.list_(
                pa.struct(
                    [
                        ("allocated_bytes", pa.uint64()),
                        ("device", pa.int64()),
                        ("peak_allocated_bytes", pa.uint64()),
                        ("peak_reserved_bytes", pa.uint64()),
                        ("reserved_bytes", pa.uint64()),
                    ]
                )
            ),
        ),
        ("pickle_bytes", pa.uint64()),
        ("producer", pa.string()),
        ("reserved_bytes", pa.uint64()),
        ("schema_version", pa.int64()),
        ("suspect_count", pa.int64()),
        (
            "top_suspects",
            pa.list_(
                pa.struct(
                    [
                        ("bytes", pa.uint64()),
                        ("confidence", pa.float64()),
                        ("device", pa.int64()),
                        ("kind", pa.string()),
                        ("severity", pa.string()),
                        ("site", _SITE),
                    ]
                )
            ),
        ),
    ]
)


def snapshot_paths(args: Iterable[str]) -> list[str]:
    """The files a list of PATH arguments names, in ``memsnap batch``'s order.

    A file is listed whatever its name; a directory is walked with its entries sorted by name
    (byte order), subdirectories entered where they sort, keeping only snapshot names (see
    ``_SNAPSHOT_ENDINGS``) and skipping names that start with ``.``. A file reached twice is
    listed once, where it is first reached; a directory reached twice (through links) is
    walked once. (``memsnap batch`` also expands glob patterns itself; here the shell does.)
    """
    out: list[str] = []
    seen_files: set[str] = set()
    seen_dirs: set[str] = set()

    def add(p: str) -> None:
        key = os.path.realpath(p)
        if key not in seen_files:
            seen_files.add(key)
            out.append(p)

    def walk(folder: str) -> None:
        key = os.path.realpath(folder)
        if key in seen_dirs:
            return
        seen_dirs.add(key)
        for name in sorted(os.listdir(folder), key=os.fsencode):
            if name.startswith("."):
                continue
            p = os.path.join(folder, name)
            if os.path.isdir(p):
                walk(p)
            elif os.path.isfile(p) and name.lower().endswith(_SNAPSHOT_ENDINGS):
                add(p)

    for arg in args:
        if os.path.isdir(arg):
            walk(arg)
        else:
            add(arg)
    return out


def rows_table(batch: pa.Table) -> pa.Table:
    """The rows of a batch of ``{"path": ...}`` items, as an Arrow table of :data:`ROW_SCHEMA`.

    ``memsnap.row`` gives each row as a dict; the table is built with the schema rather than
    by Ray's inference from Python values, which types each block on its own (a block of error
    rows would give null-typed columns) and cannot store a total held at 2**64 - 1 as an
    integer (such a block is written as pickled objects). A row whose keys are not the
    schema's (a newer memsnap with more fields) is an error, not a silently dropped column.
    """
    rows = [memsnap.row({"path": p}) for p in batch.column("path").to_pylist()]
    names = set(ROW_SCHEMA.names)
    for row in rows:
        if set(row) != names:
            raise ValueError(
                f"row of {row.get('path')!r}: keys differ from ROW_SCHEMA "
                f"(extra {sorted(set(row) - names)}, missing {sorted(names - set(row))})"
            )
    return pa.Table.from_pylist(rows, schema=ROW_SCHEMA)


def analyse_archive(
    paths: list[str],
    out_dir: str,
    memory_per_task: Optional[int] = None,
    blocks: Optional[int] = None,
) -> Any:
    """Write the rows of ``paths`` to ``out_dir`` as Parquet; returns the materialized dataset.

    The inputs are cut into ``blocks`` blocks (default: one per snapshot, so that one large
    file never waits behind others in the same task); each block is one Ray task that
    analyses its snapshots one after the other (:func:`rows_table`). With
    ``memory_per_task`` each task reserves that many bytes of its node's memory, so that Ray
    does not start more analyses on a node than its memory holds (reading a snapshot peaks at
    about 1.5 times its unpickled size, docs/batch.md). The rows are materialized (they are
    small: a few KiB each) so that counting the error rows afterwards does not analyse
    everything again.
    """
    import ray

    items = [{"path": p} for p in paths]
    n_blocks = blocks if blocks is not None else len(items)
    ds = ray.data.from_items(items, override_num_blocks=max(1, min(n_blocks, len(items))))
    remote_args: dict[str, Any] = {}
    if memory_per_task is not None:
        remote_args["memory"] = memory_per_task
    rows = ds.map_batches(rows_table, batch_format="pyarrow", batch_size=None, **remote_args).materialize()
    rows.write_parquet(out_dir)
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    """The command line: ``ray_archive.py OUT_DIR PATH...``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder for the Parquet files (made if missing)")
    parser.add_argument("paths", nargs="+", help="snapshot files or directories")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default: all)")
    parser.add_argument(
        "--memory-per-task",
        default=None,
        help="memory each analysis reserves on its node, a size such as 6GiB (default: none)",
    )
    parser.add_argument(
        "--blocks", type=int, default=None, help="Ray blocks (tasks) to cut the inputs into (default: one per file)"
    )
    args = parser.parse_args(argv)

    import ray

    from memsnap._sizes import parse_size

    memory = parse_size(args.memory_per_task) if args.memory_per_task else None
    paths = snapshot_paths(args.paths)
    if not paths:
        print("ray_archive: no snapshot files found", file=sys.stderr)
        return 2
    if not ray.is_initialized():
        ray.init(num_cpus=args.num_cpus, include_dashboard=False)
    rows = analyse_archive(paths, args.out_dir, memory_per_task=memory, blocks=args.blocks)
    errors = rows.filter(lambda r: r["error"] is not None).count()
    files = sorted(Path(args.out_dir).glob("*.parquet"))
    print(
        f"ray_archive: {len(paths)} rows ({errors} unreadable) written to {args.out_dir} "
        f"({len(files)} Parquet files)",
        file=sys.stderr,
    )
    # As memsnap batch: 2 when a file could not be read (its row says why).
    return 2 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
