"""The block tables of the runner's sequences, kept as rows of one array between steps.

Building a step's ``[rows, widest]`` block table from every sequence's list of block ids
costs O(all blocks) each step: at 256 sequences of 2k tokens that was 32k ids a step, the
largest part of the input preparation. A sequence's table changes only when it takes a
block (every ``block_size`` tokens while decoding), is preempted or forks; the scheduler
hands the same list object while its blocks are unchanged (``KVCacheManager.block_ids``).
So each sequence keeps a row here, rewritten only when its list is a new one whose ids
differ, and a step's table is one gather of its rows. A list that arrives as a new object
with the same ids (a rank in another process, which receives a copy each step) costs one
comparison, not a rewrite.

Columns past a row's length hold 0, the null block, as ``padded_tables`` pads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FIRST_ROWS = 64
FIRST_WIDTH = 64


@dataclass
class _Row:
    index: int  # the row of the array holding this sequence's table
    ids: list[int]  # the list it was written from (compared by identity first)


class BlockTableRows:
    """Each sequence's block table as a row of ``array``; ``gather`` builds a step's."""

    def __init__(self, rows: int = FIRST_ROWS, width: int = FIRST_WIDTH) -> None:
        self.array = np.zeros((rows, width), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int64)
        self._rows: dict[int, _Row] = {}
        self._free = list(range(rows - 1, -1, -1))

    def __len__(self) -> int:
        """Sequences holding a row."""
        return len(self._rows)

    def gather(self, seq_ids: list[int], tables: list[list[int]]) -> np.ndarray:
        """The ``[len(seq_ids), widest]`` int32 table of these sequences' rows (a copy),
        after taking in each list that changed since the sequence's last step."""
        indices = []
        for seq_id, ids in zip(seq_ids, tables, strict=True):
            row = self._rows.get(seq_id)
            if row is None or (row.ids is not ids and row.ids != ids):
                row = self._write(seq_id, ids, row)
            row.ids = ids  # an equal copy (another process's) is the list compared next
            indices.append(row.index)
        index = np.array(indices, dtype=np.int64)
        width = max(1, int(self.lengths[index].max())) if indices else 1
        return self.array[index, :width]

    def forget(self, seq_ids: list[int]) -> None:
        """Free the rows of sequences that finished or were preempted."""
        for seq_id in seq_ids:
            row = self._rows.pop(seq_id, None)
            if row is not None:
                self._clear(row.index)
                self._free.append(row.index)

    def _write(self, seq_id: int, ids: list[int], row: _Row | None) -> _Row:
        if row is None:
            row = _Row(self._take_row(), ids)
            self._rows[seq_id] = row
        if len(ids) > self.array.shape[1]:
            self._widen(len(ids))
        self._clear(row.index)
        self.array[row.index, : len(ids)] = ids
        self.lengths[row.index] = len(ids)
        return row

    def _clear(self, index: int) -> None:
        self.array[index, : self.lengths[index]] = 0
        self.lengths[index] = 0

    def _take_row(self) -> int:
        if not self._free:
            rows = self.array.shape[0]
            self.array = np.concatenate([self.array, np.zeros_like(self.array)])
            self.lengths = np.concatenate([self.lengths, np.zeros_like(self.lengths)])
            self._free = list(range(2 * rows - 1, rows - 1, -1))
        return self._free.pop()

    def _widen(self, width: int) -> None:
        wider = max(width, 2 * self.array.shape[1])
        grown = np.zeros((self.array.shape[0], wider), dtype=np.int32)
        grown[:, : self.array.shape[1]] = self.array
        self.array = grown
