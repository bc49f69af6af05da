#!/usr/bin/env python3
"""Which cells a sequence state file holds (llama_state_seq_save_file: a `--state-file` of
llama-kvevict-needle, its PATH.full / PATH.restored, or a llama-server slot saved with
`?action=save`): the positions of its cells, read from the file's cell metadata.

    python3 llama_fork/state_cells.py FILE [FILE ...]

Prints, per file, its token count, cell count and first/last positions, and for every file after
the first how many of its positions the first file holds too (do two evictions keep the same cells?).
Reads single-stream states of one sequence without the M-RoPE cell extension (the fork's tests'
SmolLM2).
"""
import struct
import sys

MAGIC_GGSQ = 0x67677371


def positions(path):
    """(tokens, positions) of a sequence state file."""
    b = open(path, "rb").read()
    magic, version, n_tok = struct.unpack_from("<III", b, 0)
    if magic != MAGIC_GGSQ:
        sys.exit(f"{path}: not a sequence state file (magic {magic:#x})")
    o = 12
    tokens = list(struct.unpack_from(f"<{n_tok}i", b, o))
    o += 4 * n_tok
    n_stream, cells = struct.unpack_from("<II", b, o)
    o += 8
    if n_stream != 1:
        sys.exit(f"{path}: {n_stream} streams (one expected)")
    pos = []
    for _ in range(cells):
        p, n_seq_id, seq_id = struct.unpack_from("<iIi", b, o)
        o += 12
        if n_seq_id != 1:
            sys.exit(f"{path}: a cell with {n_seq_id} sequences (one expected)")
        pos.append(p)
    return tokens, pos


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    first = None
    for path in sys.argv[1:]:
        tokens, pos = positions(path)
        line = f"{path}: {len(tokens)} tokens, {len(pos)} cells, positions {pos[:3]} .. {pos[-3:]}"
        if first is None:
            first = set(pos)
        else:
            line += f"; {len(first & set(pos))} of them in the first file"
        print(line)


if __name__ == "__main__":
    main()
