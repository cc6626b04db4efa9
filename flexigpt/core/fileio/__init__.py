"""Pure file I/O of the harness (core layer: imports nothing from the harness but
:mod:`flexigpt.core.faults`).

    flexigpt.core.fileio.outputs   outputs that appear complete or not at all: atomic_directory,
                              atomic_write_text/bytes, the output marker, check_output,
                              clean_partials, restore_swapped, force_outputs, sha256_file
    flexigpt.core.fileio.exchange  two directories swapped in one step (renameat2), when the
                              system has it: exchange, NO_EXCHANGE_ENV
    flexigpt.core.fileio.checks    a directory holds only what was recorded, nothing outside
                              itself, an output apart from its inputs: check_apart, check_inside, check_listed, unlisted, verify_files,
                              verify_marker

Every public name of them is importable from here.
"""

from __future__ import annotations

from flexigpt.core.fileio.checks import (
    PICKLE_SUFFIXES,
    REWRITABLE,
    WORKFLOW_FILES,
    InputOverlapError,
    beside_prefixes,
    check_apart,
    check_inside,
    check_listed,
    check_safetensors,
    escapes,
    unlisted,
    verify_files,
    verify_marker,
)
from flexigpt.core.fileio.exchange import NO_EXCHANGE_ENV, exchange
from flexigpt.core.fileio.outputs import (
    MANIFEST,
    MARKER,
    CheckpointError,
    OutputExistsError,
    atomic_directory,
    atomic_write_bytes,
    atomic_write_text,
    check_output,
    clean_partials,
    current_umask,
    force_outputs,
    foreign_reason,
    kind_of,
    make_staging,
    read_json_or_none,
    restore_swapped,
    sha256_file,
    tree_entries,
)

__all__ = ["MANIFEST", "MARKER", "NO_EXCHANGE_ENV", "PICKLE_SUFFIXES", "REWRITABLE",
           "WORKFLOW_FILES", "CheckpointError", "InputOverlapError", "OutputExistsError",
           "atomic_directory", "atomic_write_bytes", "atomic_write_text", "beside_prefixes",
           "check_apart", "check_inside", "check_listed", "check_output", "check_safetensors",
           "clean_partials", "current_umask", "escapes", "exchange", "force_outputs",
           "foreign_reason", "kind_of", "make_staging", "read_json_or_none", "restore_swapped",
           "sha256_file", "tree_entries", "unlisted", "verify_files", "verify_marker"]
